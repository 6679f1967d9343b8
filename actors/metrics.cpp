#include "actors/metrics.hpp"

#include <algorithm>

#include <httplib.h>

#include <memory>
#include <sstream>

#include "actors/http_listener.hpp"

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
  auto server = std::make_unique<httplib::Server>();
  server->Get("/metrics", [&registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry.render(), "text/plain; version=0.0.4");
  });
  auto listener = HttpListener::start(std::move(server), host_port, "metrics", /*max_backlog=*/false);
  if (!listener) return std::move(listener).error();
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->listener_ = std::move(listener).value();
  return s;
}

MetricsServer::~MetricsServer() = default;

int MetricsServer::port() const { return listener_->port(); }

}  // namespace shardline::actors
