// The tables of worker.capnp: WorkerMessage <-> WorkerMsg, WorkerReply <->
// WorkerReply (see messages/codec_detail.hpp).
#include "messages/codec.hpp"
#include "messages/codec_detail.hpp"
#include "messages/worker.capnp.h"

namespace shardline::messages {

namespace detail {

// ============================================================================
// WorkerMessage (Ack / Shutdown / Error: codec_detail.hpp)
// ============================================================================

using WM = wire::WorkerMessage;

template <>
struct Member<WM, AssignWork> {
  static constexpr auto which = WM::ASSIGN_WORK;
  static void put(WM::Builder root, const AssignWork& m) {
    put_all(root.initAssignWork().initRequests(static_cast<unsigned>(m.requests.size())), m.requests);
  }
  static AssignWork get(WM::Reader root) {
    auto list = root.getAssignWork().getRequests();
    check_len(list, "requests");
    AssignWork m;
    m.requests.reserve(list.size());
    for (unsigned i = 0; i < list.size(); ++i) m.requests.push_back(detail::get(list[i], at("requests", i)));
    return m;
  }
};

template <>
struct Member<WM, CancelJob> {
  static constexpr auto which = WM::CANCEL_JOB;
  static void put(WM::Builder root, const CancelJob& m) { root.initCancelJob().setJobId(m.job_id); }
  static CancelJob get(WM::Reader root) { return CancelJob{root.getCancelJob().getJobId()}; }
};

template <>
struct Member<WM, WorkerStatusQuery> {
  static constexpr auto which = WM::STATUS_QUERY;
  static void put(WM::Builder root, const WorkerStatusQuery&) { root.setStatusQuery(); }
  static WorkerStatusQuery get(WM::Reader) { return {}; }
};

template <>
struct Member<WM, HelloAgain> {
  static constexpr auto which = WM::HELLO_AGAIN;
  static void put(WM::Builder root, const HelloAgain&) { root.setHelloAgain(); }
  static HelloAgain get(WM::Reader) { return {}; }
};

template <>
struct Member<WM, SidpSwitch> {
  static constexpr auto which = WM::SIDP_SWITCH;
  static void put(WM::Builder root, const SidpSwitch& m) {
    auto b = root.initSidpSwitch();
    b.setGroup(text(m.group));
    b.setMode(text(m.mode));
    b.setEpoch(m.epoch);
  }
  static SidpSwitch get(WM::Reader root) {
    auto r = root.getSidpSwitch();
    SidpSwitch m{str(r.getGroup()), str(r.getMode()), r.getEpoch()};
    check_sidp_mode(m.mode, "mode", false);
    if (m.epoch == 0) fail(ErrorCode::invalid_argument, "epoch: must be >= 1");
    return m;
  }
};

// ============================================================================
// WorkerReply
// ============================================================================

using WR = wire::WorkerReply;

template <>
struct Member<WR, WorkerStatus> {
  static constexpr auto which = WR::STATUS;
  static void put(WR::Builder root, const WorkerStatus& m) { detail::put(root.initStatus(), m); }
  static WorkerStatus get(WR::Reader root) { return detail::get(root.getStatus()); }
};

}  // namespace detail

std::string encode(const WorkerMsg& msg) { return detail::encode_table<wire::WorkerMessage>(msg); }

std::string encode(const WorkerReply& msg) { return detail::encode_table<wire::WorkerReply>(msg); }

Result<WorkerMsg> decode_worker(std::string_view bytes) noexcept {
  return detail::decode_table<wire::WorkerMessage, WorkerMsg>(bytes, "worker message");
}

Result<WorkerReply> decode_worker_reply(std::string_view bytes) noexcept {
  return detail::decode_table<wire::WorkerReply, WorkerReply>(bytes, "worker reply");
}

const char* kind_name(const WorkerMsg& msg) noexcept { return detail::wire_name<wire::WorkerMessage>(msg.index()); }

const char* kind_name(const WorkerReply& msg) noexcept { return detail::wire_name<wire::WorkerReply>(msg.index()); }

}  // namespace shardline::messages
