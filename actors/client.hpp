#pragma once
/// \file
/// Talks to a node's orchestrator: in-process (`shardline run`) or over TCP
/// (`shardline job ...`, `shardline actor ...`), signing every command with
/// the cluster key.

#include <caf/all.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "actors/auth.hpp"
#include "common/result.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {

class ClusterTls;  // actors/cluster_tls.hpp

class Client {
 public:
  /// Connects to the node at HOST:PORT with the key in `key_file`, over
  /// mutual TLS (actors/cluster_tls.hpp). Errors: not_found / corrupt (key
  /// file), io (unreachable, or a node of another cluster key: its TLS
  /// handshake fails; the message says how to start a node or name another,
  /// issue 46, item 14).
  [[nodiscard]] static Result<std::unique_ptr<Client>> connect(const std::string& host_port,
                                                              const std::string& key_file);
  /// A client of an orchestrator in this process.
  [[nodiscard]] static std::unique_ptr<Client> local(caf::actor_system& system, caf::actor orchestrator,
                                                     std::shared_ptr<const ClusterKey> key);
  ~Client();

  /// Sends a command and waits for the reply. An Error reply is returned
  /// as that Error (the Result never holds the Error alternative). Errors: io
  /// (timeout, connection lost), corrupt (undecodable reply), or the
  /// orchestrator's own error.
  [[nodiscard]] Result<messages::OrchestratorReply> call(const messages::OrchestratorMsg& msg,
                                                        std::chrono::milliseconds timeout = std::chrono::seconds(30));

  /// call() for a command whose reply is the alternative T, e.g.
  /// `call<messages::JobSubmitted>(messages::SubmitJob{...})`. Errors: those
  /// of call(), and corrupt when the reply is another alternative.
  template <class T>
  [[nodiscard]] Result<T> call(const messages::OrchestratorMsg& msg,
                               std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    Result<messages::OrchestratorReply> reply = call(msg, timeout);
    if (!reply) return std::move(reply).error();
    if (T* value = std::get_if<T>(&*reply)) return std::move(*value);
    return make_error(ErrorCode::corrupt, std::string("unexpected reply '") + messages::kind_name(*reply) +
                                              "' to '" + messages::kind_name(msg) + "'");
  }

 private:
  Client() = default;
  std::shared_ptr<ClusterTls> tls_;  ///< own_system_'s TLS transport (connect() only)
  std::unique_ptr<caf::actor_system_config> own_config_;
  std::unique_ptr<caf::actor_system> own_system_;
  caf::actor_system* system_ = nullptr;
  caf::actor orchestrator_;
  std::shared_ptr<const ClusterKey> key_;
};

}  // namespace shardline::actors
