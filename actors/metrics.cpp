#include "actors/metrics.hpp"

#include <algorithm>

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <sstream>
#include <thread>

#include "comm/address.hpp"

namespace shardline::actors {

void MetricsRegistry::describe(const std::string& name, const std::string& type, const std::string& help) {
  std::lock_guard lock(mu_);
  Family& f = families_[name];
  f.type = type;
  f.help = help;
}

void MetricsRegistry::add(const std::string& name, const std::string& labels, double delta) {
  std::lock_guard lock(mu_);
  families_[name].samples[labels] += delta;
}

void MetricsRegistry::set(const std::string& name, const std::string& labels, double value) {
  std::lock_guard lock(mu_);
  families_[name].samples[labels] = value;
}

double MetricsRegistry::get(const std::string& name, const std::string& labels) const {
  std::lock_guard lock(mu_);
  const auto f = families_.find(name);
  if (f == families_.end()) return 0;
  const auto s = f->second.samples.find(labels);
  return s == f->second.samples.end() ? 0 : s->second;
}

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mu_);
  std::ostringstream out;
  out.precision(17);
  for (const auto& [name, f] : families_) {
    if (!f.help.empty()) out << "# HELP " << name << " " << f.help << "\n";
    if (!f.type.empty()) out << "# TYPE " << name << " " << f.type << "\n";
    for (const auto& [labels, h] : f.histograms) {
      const std::string sep = labels.empty() ? "" : labels + ",";
      std::uint64_t cumulative = 0;
      for (std::size_t i = 0; i < f.buckets.size(); ++i) {
        cumulative += h.counts[i];
        out << name << "_bucket{" << sep << "le=\"" << f.buckets[i] << "\"} " << cumulative << "\n";
      }
      out << name << "_bucket{" << sep << "le=\"+Inf\"} " << h.count << "\n";
      const std::string l = labels.empty() ? "" : "{" + labels + "}";
      out << name << "_sum" << l << " " << h.sum << "\n";
      out << name << "_count" << l << " " << h.count << "\n";
    }
    for (const auto& [labels, value] : f.samples) {
      out << name;
      if (!labels.empty()) out << "{" << labels << "}";
      out << " " << value << "\n";
    }
  }
  return out.str();
}

void MetricsRegistry::describe_histogram(const std::string& name, const std::string& help,
                                         std::vector<double> buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = families_[name];
  f.type = "histogram";
  f.help = help;
  std::sort(buckets.begin(), buckets.end());
  f.buckets = std::move(buckets);
}

void MetricsRegistry::observe(const std::string& name, const std::string& labels, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.type != "histogram") return;
  Family& f = it->second;
  Histogram& h = f.histograms[labels];
  h.counts.resize(f.buckets.size(), 0);
  const auto b = std::lower_bound(f.buckets.begin(), f.buckets.end(), value);
  if (b != f.buckets.end()) ++h.counts[static_cast<std::size_t>(b - f.buckets.begin())];
  h.sum += value;
  ++h.count;
}

std::uint64_t MetricsRegistry::histogram_count(const std::string& name, const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto h = it->second.histograms.find(labels);
  return h == it->second.histograms.end() ? 0 : h->second.count;
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const MetricsRegistry& registry,
                                                            const std::string& host_port) {
  auto hp = comm::parse_host_port(host_port);
  if (!hp) return std::move(hp).error();
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->server_ = std::make_unique<httplib::Server>();
  s->server_->Get("/metrics", [&registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry.render(), "text/plain; version=0.0.4");
  });
  // SO_REUSEADDR without cpp-httplib's SO_REUSEPORT: a port in use is an
  // error, not a second server sharing it (as the HTTP API's, issue 46).
  s->server_->set_socket_options([](socket_t fd) {
    const int yes = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const auto& [host, port] = *hp;
  s->port_ = port == 0 ? s->server_->bind_to_any_port(host) : (s->server_->bind_to_port(host, port) ? port : -1);
  if (s->port_ <= 0)
    return make_error(ErrorCode::io, "metrics: cannot listen on " + host_port +
                                         (port != 0 ? " (is the port in use by another process?)" : ""));
  httplib::Server* srv = s->server_.get();
  auto exited = std::make_shared<std::atomic<bool>>(false);
  s->thread_ = std::thread([srv, exited] {
    srv->listen_after_bind();
    *exited = true;
  });
  // Until the thread is in its accept loop, stop() is a no-op (cpp-httplib
  // 0.11 checks is_running), so a server destroyed at once would never be
  // joined: wait for the loop (or the thread's end), at most 10 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!srv->is_running() && !*exited && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace shardline::actors
