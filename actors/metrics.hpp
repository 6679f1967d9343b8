#pragma once
/// \file
/// Prometheus metrics of a node: a registry of named counters and gauges
/// (thread-safe; workers update them from their own threads) rendered in the
/// Prometheus text exposition format, served over HTTP at `/metrics`
/// (`--metrics HOST:PORT`).

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.hpp"

namespace shardline::actors {

class HttpListener;  // actors/http_listener.hpp

class MetricsRegistry {
 public:
  /// A metric family: `name` (e.g. "shardline_generation_tokens_total"),
  /// `type` "counter" or "gauge", one HELP line. Labels are part of the key,
  /// e.g. add("shardline_requests_total", "state=\"done\"", 1).
  void describe(const std::string& name, const std::string& type, const std::string& help);
  /// A histogram family with the given bucket upper bounds (ascending;
  /// +Inf is implied), rendered as NAME_bucket{le=...}, NAME_sum, NAME_count.
  void describe_histogram(const std::string& name, const std::string& help, std::vector<double> buckets);
  /// One observation of a histogram described before (else ignored).
  void observe(const std::string& name, const std::string& labels, double value);
  /// Observations of a histogram so far (0 when none).
  [[nodiscard]] std::uint64_t histogram_count(const std::string& name, const std::string& labels = "") const;
  void add(const std::string& name, const std::string& labels, double delta);
  void set(const std::string& name, const std::string& labels, double value);
  [[nodiscard]] double get(const std::string& name, const std::string& labels = "") const;
  /// The text exposition format (families sorted by name).
  [[nodiscard]] std::string render() const;

 private:
  struct Histogram {
    std::vector<std::uint64_t> counts;  ///< per bucket (not cumulative)
    double sum = 0.0;
    std::uint64_t count = 0;
  };
  struct Family {
    std::string type;
    std::string help;
    std::map<std::string, double> samples;  // labels -> value
    std::vector<double> buckets;            // histograms only
    std::map<std::string, Histogram> histograms;  // labels -> histogram
  };
  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

/// Serves a registry on HOST:PORT in a background thread until destroyed.
class MetricsServer {
 public:
  /// Binds and starts serving. Errors: invalid_argument (bad address), io (bind failed).
  [[nodiscard]] static Result<std::unique_ptr<MetricsServer>> start(const MetricsRegistry& registry,
                                                                    const std::string& host_port);
  ~MetricsServer();
  [[nodiscard]] int port() const;

 private:
  MetricsServer() = default;
  std::unique_ptr<HttpListener> listener_;
};

}  // namespace shardline::actors
