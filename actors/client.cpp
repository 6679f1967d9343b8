#include "actors/client.hpp"

#include <caf/io/all.hpp>

#include "actors/cluster_tls.hpp"
#include "actors/protocol.hpp"
#include "comm/address.hpp"

namespace shardline::actors {

Result<std::unique_ptr<Client>> Client::connect(const std::string& host_port, const std::string& key_file) {
  auto key = ClusterKey::load(key_file);
  if (!key) return std::move(key).error();
  auto hp = comm::parse_host_port(host_port);
  if (!hp) return std::move(hp).error();
  std::unique_ptr<Client> c(new Client());
  c->key_ = std::make_shared<const ClusterKey>(std::move(key).value());
  auto tls = ClusterTls::create(*c->key_, nullptr);
  if (!tls) return std::move(tls).error();
  c->tls_ = std::move(tls).value();
  c->own_config_ = std::make_unique<caf::actor_system_config>();
  c->own_config_->load<caf::io::middleman>();
  c->own_config_->set("scheduler.max-threads", 1);
  c->own_config_->set("logger.console-verbosity", caf::atom("quiet"));
  c->own_system_ = std::make_unique<caf::actor_system>(*c->own_config_);
  c->system_ = c->own_system_.get();
  c->tls_->start(*c->system_);
  auto remote = c->tls_->connect(hp->first, static_cast<std::uint16_t>(hp->second));
  if (!remote)
    return make_error(remote.error().code, remote.error().message +
                                               "; start one with `shardline node start`, or pass --node HOST:PORT of "
                                               "a running one");
  c->orchestrator_ = *remote;
  return c;
}

std::unique_ptr<Client> Client::local(caf::actor_system& system, caf::actor orchestrator,
                                      std::shared_ptr<const ClusterKey> key) {
  std::unique_ptr<Client> c(new Client());
  c->system_ = &system;
  c->orchestrator_ = std::move(orchestrator);
  c->key_ = std::move(key);
  return c;
}

Client::~Client() {
  orchestrator_ = caf::actor();
  if (tls_) tls_->stop();
  own_system_.reset();
}

Result<messages::OrchestratorReply> Client::call(const messages::OrchestratorMsg& msg,
                                                 std::chrono::milliseconds timeout) {
  const Signed s = sign(*key_, messages::encode(msg));
  caf::scoped_actor self{*system_};
  Result<messages::OrchestratorReply> out = make_error(ErrorCode::io, "no reply");
  self->request(orchestrator_, timeout, msg_atom::value, s.tag, s.bytes)
      .receive(
          [&](const std::string& sealed) {
            auto bytes = open_reply(*key_, s.tag, sealed);
            if (!bytes) {
              out = make_error(ErrorCode::io, "orchestrator reply: " + bytes.error().message);
              return;
            }
            auto reply = messages::decode_orchestrator_reply(*bytes);
            if (!reply) {
              out = std::move(reply).error();
            } else if (auto* error = std::get_if<Error>(&*reply)) {
              out = std::move(*error);
            } else {
              out = std::move(reply).value();
            }
          },
          [&](caf::error& e) { out = make_error(ErrorCode::io, "orchestrator did not answer: " + system_->render(e)); });
  return out;
}

}  // namespace shardline::actors
