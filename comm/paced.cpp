#include "comm/paced.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>
#include <thread>
#include <utility>

namespace shardline::comm {
namespace {

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Result<double> parse_number(std::string_view text, const char* what) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return make_error(ErrorCode::invalid_argument,
                      std::string("link spec: ") + what + " '" + std::string(text) +
                          "' is not a decimal number");
  }
  return v;
}

/// Upper bound of one transfer's time, so that time points cannot overflow.
constexpr double kMaxTransferNs = 30.0 * 365 * 24 * 3600 * 1e9;

}  // namespace

Status validate(const LinkSpec& spec) {
  if (!std::isfinite(spec.gbps) || spec.gbps <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "link spec: bandwidth must be a finite number of GB/s > 0, got " +
                          number_text(spec.gbps));
  }
  if (!std::isfinite(spec.latency_us) || spec.latency_us < 0) {
    return make_error(ErrorCode::invalid_argument,
                      "link spec: latency must be a finite number of microseconds >= 0, got " +
                          number_text(spec.latency_us));
  }
  return Status();
}

Result<LinkSpec> parse_link_spec(std::string_view gbps, std::string_view latency_us) {
  auto bw = parse_number(gbps, "bandwidth (GB/s)");
  if (!bw.ok()) return bw.error();
  auto lat = parse_number(latency_us, "latency (us)");
  if (!lat.ok()) return lat.error();
  LinkSpec spec{bw.value(), lat.value()};
  if (Status st = validate(spec); !st.ok()) return st.error();
  return spec;
}

// ---- LinkModel ---------------------------------------------------------------

LinkModel::LinkModel(int world_size, LinkSpec spec)
    : spec_(spec),
      egress_free_(static_cast<std::size_t>(world_size)),
      ingress_free_(static_cast<std::size_t>(world_size)) {}

Result<std::shared_ptr<LinkModel>> LinkModel::create(int world_size, LinkSpec spec) {
  if (world_size < 1) {
    return make_error(ErrorCode::invalid_argument,
                      "link model: world size must be >= 1, got " + std::to_string(world_size));
  }
  if (Status st = validate(spec); !st.ok()) return st.error();
  return std::shared_ptr<LinkModel>(new LinkModel(world_size, spec));
}

std::chrono::nanoseconds LinkModel::transfer_time(std::uint64_t bytes) const noexcept {
  // gbps GB/s = gbps bytes per nanosecond.
  const double ns = spec_.latency_us * 1e3 + static_cast<double>(bytes) / spec_.gbps;
  return std::chrono::nanoseconds(std::llround(std::min(ns, kMaxTransferNs)));
}

Result<LinkModel::TimePoint> LinkModel::reserve(int src, int dst, std::uint64_t bytes,
                                                TimePoint now) {
  const int world = world_size();
  if (src < 0 || src >= world || dst < 0 || dst >= world) {
    return make_error(ErrorCode::invalid_argument,
                      "link model: transfer " + std::to_string(src) + " -> " +
                          std::to_string(dst) + " is outside ranks [0, " +
                          std::to_string(world) + ")");
  }
  if (src == dst) return now;
  const auto s = static_cast<std::size_t>(src);
  const auto d = static_cast<std::size_t>(dst);
  const std::chrono::nanoseconds busy = transfer_time(bytes);
  std::lock_guard lock(mu_);
  const TimePoint start = std::max({now, egress_free_[s], ingress_free_[d]});
  const TimePoint end = start + busy;
  egress_free_[s] = end;
  ingress_free_[d] = end;
  reserved_bytes_ += bytes;
  return end;
}

std::uint64_t LinkModel::reserved_bytes() const {
  std::lock_guard lock(mu_);
  return reserved_bytes_;
}

// ---- PacedCommunicator -------------------------------------------------------

Result<std::unique_ptr<PacedCommunicator>> PacedCommunicator::create(
    Communicator& inner, std::shared_ptr<LinkModel> link) {
  if (!link) {
    return make_error(ErrorCode::invalid_argument, "paced communicator: no link model");
  }
  if (link->world_size() != inner.world_size()) {
    return make_error(ErrorCode::invalid_argument,
                      "paced communicator: link model has " + std::to_string(link->world_size()) +
                          " ranks, the communicator " + std::to_string(inner.world_size()));
  }
  std::vector<int> ports(static_cast<std::size_t>(inner.world_size()));
  for (std::size_t r = 0; r < ports.size(); ++r) ports[r] = static_cast<int>(r);
  return std::unique_ptr<PacedCommunicator>(new PacedCommunicator(inner, std::move(link), nullptr, std::move(ports), false));
}

Result<std::unique_ptr<PacedCommunicator>> PacedCommunicator::create(std::unique_ptr<Communicator> inner,
                                                                     std::shared_ptr<LinkModel> link,
                                                                     std::vector<int> link_ports,
                                                                     bool pace_collectives) {
  const auto bad = [](const std::string& m) { return make_error(ErrorCode::invalid_argument, "paced communicator: " + m); };
  if (!inner) return bad("no communicator");
  if (!link) return bad("no link model");
  if (static_cast<int>(link_ports.size()) != inner->world_size())
    return bad(std::to_string(link_ports.size()) + " link ports for " + std::to_string(inner->world_size()) + " ranks");
  std::vector<bool> used(static_cast<std::size_t>(link->world_size()), false);
  for (const int p : link_ports) {
    if (p < 0 || p >= link->world_size())
      return bad("link port " + std::to_string(p) + " outside the link's " + std::to_string(link->world_size()) +
                 " ports");
    if (used[static_cast<std::size_t>(p)]) return bad("link port " + std::to_string(p) + " given twice");
    used[static_cast<std::size_t>(p)] = true;
  }
  Communicator& ref = *inner;
  return std::unique_ptr<PacedCommunicator>(
      new PacedCommunicator(ref, std::move(link), std::move(inner), std::move(link_ports), pace_collectives));
}

void PacedCommunicator::wait_until(LinkModel::TimePoint until) {
  const auto before = LinkModel::Clock::now();
  if (until <= before) return;
  std::this_thread::sleep_until(until);
  const auto slept = LinkModel::Clock::now() - before;
  link_wait_ns_.fetch_add(static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(slept).count()));
}

Status PacedCommunicator::send(const void* data, std::size_t bytes, int peer, int tag) {
  const int me = rank();
  if (peer == me || peer < 0 || peer >= world_size()) {
    return inner_.send(data, bytes, peer, tag);  // no link, or the inner error
  }
  auto end = link_->reserve(port(me), port(peer), bytes, LinkModel::Clock::now());
  if (!end.ok()) return end.error();
  wait_until(end.value());
  Status st = inner_.send(data, bytes, peer, tag);
  if (st.ok()) paced_bytes_.fetch_add(bytes);
  return st;
}

Status PacedCommunicator::get(int peer, std::string name, std::size_t offset, void* dst,
                              std::size_t bytes) {
  const int me = rank();
  if (peer == me || peer < 0 || peer >= world_size()) {
    return inner_.get(peer, std::move(name), offset, dst, bytes);
  }
  const auto issued = LinkModel::Clock::now();
  Status st = inner_.get(peer, std::move(name), offset, dst, bytes);
  if (!st.ok()) return st;  // nothing moved: the link stays free
  auto end = link_->reserve(port(peer), port(me), bytes, issued);
  if (!end.ok()) return end.error();
  wait_until(end.value());
  paced_bytes_.fetch_add(bytes);
  return st;
}

}  // namespace shardline::comm
