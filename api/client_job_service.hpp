#pragma once
/// \file
/// The batch API's JobService over an actors::Client: jobs go to the
/// cluster's orchestrator (on any node: a joined node's client reaches the
/// orchestrator through its proxy).

#include <memory>

#include "actors/client.hpp"
#include "api/batch_api.hpp"

namespace shardline::api {

class ClientJobService final : public JobService {
 public:
  explicit ClientJobService(std::unique_ptr<actors::Client> client) : client_(std::move(client)) {}
  [[nodiscard]] Result<std::uint64_t> submit(const messages::SubmitJob& job) override {
    auto reply = client_->call<messages::JobSubmitted>(job, std::chrono::minutes(5));
    if (!reply) return std::move(reply).error();
    return reply->job_id;
  }
  [[nodiscard]] Result<messages::JobProgress> progress(std::uint64_t job_id) override {
    auto reply = client_->call<messages::JobStatusList>(messages::JobStatusQuery{job_id});
    if (!reply) return std::move(reply).error();
    if (reply->jobs.empty()) return make_error(ErrorCode::not_found, "no job " + std::to_string(job_id));
    return reply->jobs.front();
  }

  [[nodiscard]] Result<messages::JobProgress> cancel(std::uint64_t job_id) override {
    auto reply = client_->call<messages::JobStatusList>(messages::JobCancel{job_id});
    if (!reply) return std::move(reply).error();
    if (reply->jobs.empty()) return make_error(ErrorCode::not_found, "no job " + std::to_string(job_id));
    return reply->jobs.front();
  }

 private:
  std::unique_ptr<actors::Client> client_;
};

}  // namespace shardline::api
