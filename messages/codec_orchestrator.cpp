// The tables of orchestrator.capnp: OrchestratorMessage <-> OrchestratorMsg,
// OrchestratorReply <-> OrchestratorReply (see messages/codec_detail.hpp).
#include "messages/codec.hpp"
#include "messages/codec_detail.hpp"
#include "messages/orchestrator.capnp.h"

namespace shardline::messages {

namespace detail {

// ============================================================================
// OrchestratorMessage (Ack / Shutdown / Error: codec_detail.hpp)
// ============================================================================

using OM = wire::OrchestratorMessage;

template <>
struct Member<OM, SubmitJob> {
  static constexpr auto which = OM::SUBMIT_JOB;
  static void put(OM::Builder root, const SubmitJob& m) {
    auto b = root.initSubmitJob();
    b.setModelDir(text(m.model_dir));
    set_texts(b.initInputs(static_cast<unsigned>(m.inputs.size())), m.inputs);
    b.setOutput(text(m.output));
    if (m.parallel) b.setParallel(text(m.parallel->to_string()));
    b.setTokenBudget(text(m.token_budget));
    b.setWeightSharing(text(m.weight_sharing));
    b.setChatTemplate(text(m.chat_template));
    b.setOverwrite(m.overwrite);
  }
  static SubmitJob get(OM::Reader root) {
    auto r = root.getSubmitJob();
    SubmitJob m;
    m.model_dir = str(r.getModelDir());
    m.inputs = get_texts(r.getInputs(), "inputs");
    m.output = str(r.getOutput());
    m.parallel = get_parallel(r.getParallel(), "parallel");
    m.token_budget = get_token_budget(r.getTokenBudget(), "tokenBudget");
    m.weight_sharing = str(r.getWeightSharing());
    m.chat_template = str(r.getChatTemplate());
    m.overwrite = r.getOverwrite();
    if (!m.weight_sharing.empty() && m.weight_sharing != "none" && m.weight_sharing != "sidp")
      fail(ErrorCode::invalid_argument, "weightSharing: \"none\" or \"sidp\", got \"" + m.weight_sharing + "\"");
    return m;
  }
};

template <>
struct Member<OM, JobStatusQuery> {
  static constexpr auto which = OM::JOB_STATUS_QUERY;
  static void put(OM::Builder root, const JobStatusQuery& m) { root.initJobStatusQuery().setJobId(m.job_id); }
  static JobStatusQuery get(OM::Reader root) { return JobStatusQuery{root.getJobStatusQuery().getJobId()}; }
};

template <>
struct Member<OM, JobCancel> {
  static constexpr auto which = OM::JOB_CANCEL;
  static void put(OM::Builder root, const JobCancel& m) { root.initJobCancel().setJobId(m.job_id); }
  static JobCancel get(OM::Reader root) { return JobCancel{root.getJobCancel().getJobId()}; }
};

template <>
struct Member<OM, ActorListQuery> {
  static constexpr auto which = OM::ACTOR_LIST_QUERY;
  static void put(OM::Builder root, const ActorListQuery&) { root.setActorListQuery(); }
  static ActorListQuery get(OM::Reader) { return {}; }
};

template <>
struct Member<OM, KillActor> {
  static constexpr auto which = OM::KILL_ACTOR;
  static void put(OM::Builder root, const KillActor& m) { root.initKillActor().setName(text(m.name)); }
  static KillActor get(OM::Reader root) { return KillActor{str(root.getKillActor().getName())}; }
};

template <>
struct Member<OM, WorkerHello> {
  static constexpr auto which = OM::WORKER_HELLO;
  static void put(OM::Builder root, const WorkerHello& m) {
    auto b = root.initWorkerHello();
    b.setWorkerName(text(m.worker_name));
    b.setDevice(text(m.device));
    b.setMaxBatch(m.max_batch);
    b.setParallel(text(m.parallel.to_string()));
    auto held = b.initHeld(static_cast<unsigned>(m.held.size()));
    for (unsigned i = 0; i < held.size(); ++i) {
      held[i].setJobId(m.held[i].job_id);
      held[i].setLineIndex(m.held[i].line_index);
    }
    b.setSidpGroup(text(m.sidp_group));
    b.setSidpRank(m.sidp_rank);
    b.setSidpRanks(m.sidp_ranks);
  }
  static WorkerHello get(OM::Reader root) {
    auto r = root.getWorkerHello();
    WorkerHello m;
    m.worker_name = str(r.getWorkerName());
    m.device = str(r.getDevice());
    m.max_batch = r.getMaxBatch();
    // "" (a sender without the field) is a single device.
    m.parallel = get_parallel(r.getParallel(), "parallel").value_or(engine::ParallelConfig{});
    if (m.parallel.dp != 1)
      fail(ErrorCode::invalid_argument,
           "parallel: a worker is one engine group, dp must be 1, got " + std::to_string(m.parallel.dp));
    auto held = r.getHeld();
    check_len(held, "held");
    m.held.reserve(held.size());
    for (auto l : held) m.held.push_back(worker::LineRef{l.getJobId(), l.getLineIndex()});
    m.sidp_group = str(r.getSidpGroup());
    m.sidp_rank = r.getSidpRank();
    m.sidp_ranks = r.getSidpRanks();
    if (!m.sidp_group.empty() && (m.sidp_ranks < 2 || m.sidp_rank >= m.sidp_ranks))
      fail(ErrorCode::invalid_argument, "sidpRank: a SiDP group has >= 2 ranks and rank < ranks, got rank " +
                                            std::to_string(m.sidp_rank) + " of " + std::to_string(m.sidp_ranks));
    return m;
  }
};

template <>
struct Member<OM, LayerOwnerHello> {
  static constexpr auto which = OM::LAYER_OWNER_HELLO;
  static void put(OM::Builder root, const LayerOwnerHello& m) {
    auto b = root.initLayerOwnerHello();
    b.setOwnerName(text(m.owner_name));
    b.setNode(text(m.node));
    b.setGroup(text(m.group));
    b.setRank(m.rank);
    auto layers = b.initLayers(static_cast<unsigned>(m.layers.size()));
    for (unsigned i = 0; i < layers.size(); ++i) layers.set(i, m.layers[i]);
    b.setWeightBytes(m.weight_bytes);
    b.setLoaded(m.loaded);
    b.setLoads(m.loads);
  }
  static LayerOwnerHello get(OM::Reader root) {
    auto r = root.getLayerOwnerHello();
    LayerOwnerHello m;
    m.owner_name = str(r.getOwnerName());
    m.node = str(r.getNode());
    m.group = str(r.getGroup());
    m.rank = r.getRank();
    auto layers = r.getLayers();
    check_len(layers, "layers");
    for (std::uint32_t l : layers) m.layers.push_back(l);
    m.weight_bytes = r.getWeightBytes();
    m.loaded = r.getLoaded();
    m.loads = r.getLoads();
    return m;
  }
};

template <>
struct Member<OM, WorkerResults> {
  static constexpr auto which = OM::WORKER_RESULTS;
  static void put(OM::Builder root, const WorkerResults& m) {
    auto b = root.initWorkerResults();
    b.setWorkerName(text(m.worker_name));
    put_all(b.initResults(static_cast<unsigned>(m.results.size())), m.results);
  }
  static WorkerResults get(OM::Reader root) {
    auto r = root.getWorkerResults();
    WorkerResults m;
    m.worker_name = str(r.getWorkerName());
    auto list = r.getResults();
    check_len(list, "results");
    m.results.reserve(list.size());
    for (unsigned i = 0; i < list.size(); ++i) m.results.push_back(detail::get(list[i], at("results", i)));
    return m;
  }
};

template <>
struct Member<OM, WorkerHeartbeat> {
  static constexpr auto which = OM::WORKER_HEARTBEAT;
  static void put(OM::Builder root, const WorkerHeartbeat& m) {
    auto b = root.initWorkerHeartbeat();
    b.setWorkerName(text(m.worker_name));
    detail::put(b.initStatus(), m.status);
  }
  static WorkerHeartbeat get(OM::Reader root) {
    auto r = root.getWorkerHeartbeat();
    return WorkerHeartbeat{str(r.getWorkerName()), detail::get(r.getStatus())};
  }
};

template <>
struct Member<OM, KvStoreHello> {
  static constexpr auto which = OM::KV_STORE_HELLO;
  static void put(OM::Builder root, const KvStoreHello& m) {
    auto b = root.initKvStoreHello();
    b.setStoreName(text(m.store_name));
    b.setNode(text(m.node));
  }
  static KvStoreHello get(OM::Reader root) {
    auto r = root.getKvStoreHello();
    return KvStoreHello{str(r.getStoreName()), str(r.getNode())};
  }
};

template <>
struct Member<OM, KvStoreHeartbeat> {
  static constexpr auto which = OM::KV_STORE_HEARTBEAT;
  static void put(OM::Builder root, const KvStoreHeartbeat& m) {
    detail::put(root.initKvStoreHeartbeat().initStats(), m.stats);
  }
  static KvStoreHeartbeat get(OM::Reader root) {
    return KvStoreHeartbeat{detail::get(root.getKvStoreHeartbeat().getStats())};
  }
};

template <>
struct Member<OM, KvProgressReport> {
  static constexpr auto which = OM::KV_PROGRESS_REPORT;
  static void put(OM::Builder root, const KvProgressReport& m) {
    auto b = root.initKvProgressReport();
    b.setWorkerName(text(m.worker_name));
    put_all(b.initProgress(static_cast<unsigned>(m.progress.size())), m.progress);
  }
  static KvProgressReport get(OM::Reader root) {
    auto r = root.getKvProgressReport();
    auto list = r.getProgress();
    check_len(list, "progress");
    KvProgressReport m;
    m.worker_name = str(r.getWorkerName());
    m.progress.reserve(list.size());
    for (unsigned i = 0; i < list.size(); ++i) m.progress.push_back(detail::get(list[i], at("progress", i)));
    return m;
  }
};

// ============================================================================
// OrchestratorReply
// ============================================================================

using OR = wire::OrchestratorReply;

template <>
struct Member<OR, JobSubmitted> {
  static constexpr auto which = OR::JOB_SUBMITTED;
  static void put(OR::Builder root, const JobSubmitted& m) { root.initJobSubmitted().setJobId(m.job_id); }
  static JobSubmitted get(OR::Reader root) { return JobSubmitted{root.getJobSubmitted().getJobId()}; }
};

template <>
struct Member<OR, JobStatusList> {
  static constexpr auto which = OR::JOB_STATUS_LIST;
  static void put(OR::Builder root, const JobStatusList& m) {
    auto b = root.initJobStatusList();
    put_all(b.initJobs(static_cast<unsigned>(m.jobs.size())), m.jobs);
    put_all(b.initSidpGroups(static_cast<unsigned>(m.sidp_groups.size())), m.sidp_groups);
  }
  static JobStatusList get(OR::Reader root) {
    auto list = root.getJobStatusList().getJobs();
    check_len(list, "jobs");
    JobStatusList m;
    m.jobs.reserve(list.size());
    for (auto j : list) m.jobs.push_back(detail::get(j));
    auto groups = root.getJobStatusList().getSidpGroups();
    check_len(groups, "sidpGroups");
    for (unsigned i = 0; i < groups.size(); ++i) m.sidp_groups.push_back(detail::get(groups[i], at("sidpGroups", i)));
    return m;
  }
};

template <>
struct Member<OR, ActorList> {
  static constexpr auto which = OR::ACTOR_LIST;
  static void put(OR::Builder root, const ActorList& m) {
    put_all(root.initActorList().initActors(static_cast<unsigned>(m.actors.size())), m.actors);
  }
  static ActorList get(OR::Reader root) {
    auto list = root.getActorList().getActors();
    check_len(list, "actors");
    ActorList m;
    m.actors.reserve(list.size());
    for (auto a : list) m.actors.push_back(detail::get(a));
    return m;
  }
};

}  // namespace detail

std::string encode(const OrchestratorMsg& msg) { return detail::encode_table<wire::OrchestratorMessage>(msg); }

std::string encode(const OrchestratorReply& msg) { return detail::encode_table<wire::OrchestratorReply>(msg); }

Result<OrchestratorMsg> decode_orchestrator(std::string_view bytes) noexcept {
  return detail::decode_table<wire::OrchestratorMessage, OrchestratorMsg>(bytes, "orchestrator message");
}

Result<OrchestratorReply> decode_orchestrator_reply(std::string_view bytes) noexcept {
  return detail::decode_table<wire::OrchestratorReply, OrchestratorReply>(bytes, "orchestrator reply");
}

const char* kind_name(const OrchestratorMsg& msg) noexcept {
  return detail::wire_name<wire::OrchestratorMessage>(msg.index());
}

const char* kind_name(const OrchestratorReply& msg) noexcept {
  return detail::wire_name<wire::OrchestratorReply>(msg.index());
}

}  // namespace shardline::messages
