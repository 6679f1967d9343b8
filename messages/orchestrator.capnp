# Messages the job orchestrator receives, and its replies to clients.
@0xe4b1433cc07d7014;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("shardline::wire");

using C = import "common.capnp";
using KS = import "kvstore.capnp";

struct SubmitJob {
  modelDir @0 :Text;
  inputs @1 :List(Text);   # JSONL shards, in order
  output @2 :Text;
  parallel @3 :Text;       # `--parallel` of the job ("tp=2,pp=1,sp=1,dp=1"); "" = not given (any config)
  tokenBudget @4 :Text;    # `--token-budget`: "fixed" or "throttle"; "" = fixed
  weightSharing @5 :Text;  # `--weight-sharing` of the job: "none" or "sidp"; "" = not given (any)
  chatTemplate @6 :Text;   # `--chat-template FILE`'s text; "" = the model folder's template
  overwrite @7 :Bool;      # `--overwrite`: an existing, non-empty output file may be replaced
}

struct JobStatusQuery {
  jobId @0 :UInt64;        # 0 = all jobs
}

# Cancel an unfinished job; the reply is a JobStatusList with its progress.
struct JobCancel {
  jobId @0 :UInt64;
}

struct KillActor {
  name @0 :Text;
}

struct LineRef {
  jobId @0 :UInt64;
  lineIndex @1 :UInt64;
}

struct WorkerHello {
  workerName @0 :Text;
  device @1 :Text;
  maxBatch @2 :UInt32;
  parallel @3 :Text;       # the worker's engine group ("tp=2,pp=1,sp=1,dp=1"); "" = a single device
  held @4 :List(LineRef);  # lines it holds (saying hello again to a restarted orchestrator)
  sidpGroup @5 :Text;      # its SiDP DP group ("NODE/sidp"); "" = not SiDP
  sidpRank @6 :UInt32;     # its rank in that group
  sidpRanks @7 :UInt32;    # ranks of that group
}

# A SiDP layer owner registers, and re-registers every heartbeat with its state.
struct LayerOwnerHello {
  ownerName @0 :Text;      # "NODE/cpu:I/owner"
  node @1 :Text;
  group @2 :Text;          # its SiDP DP group ("NODE/sidp")
  rank @3 :UInt32;
  layers @4 :List(UInt32); # the FFN layers it owns
  weightBytes @5 :UInt64;  # bytes of packed FFN weights it holds (0 while not loaded)
  loaded @6 :Bool;
  loads @7 :UInt32;        # times this owner's layers were loaded in this process (1 + respawns)
}

struct WorkerResults {
  workerName @0 :Text;
  results @1 :List(C.BatchResult);
}

struct WorkerHeartbeat {
  workerName @0 :Text;
  status @1 :C.WorkerStatus;
}

# A KV store registers (and re-registers after a restart).
struct KvStoreHello {
  storeName @0 :Text;
  node @1 :Text;
}

struct KvStoreHeartbeat {
  stats @0 :KS.KvStoreStats;
}

# A worker forwards what its KV store acknowledged.
struct KvProgressReport {
  workerName @0 :Text;
  progress @1 :List(C.KvProgress);
}

struct OrchestratorMessage {
  version @0 :UInt16;
  union {
    submitJob @1 :SubmitJob;
    jobStatusQuery @2 :JobStatusQuery;
    actorListQuery @3 :Void;
    killActor @4 :KillActor;
    workerHello @5 :WorkerHello;
    workerResults @6 :WorkerResults;
    workerHeartbeat @7 :WorkerHeartbeat;
    shutdown @8 :Void;
    kvStoreHello @9 :KvStoreHello;
    kvStoreHeartbeat @10 :KvStoreHeartbeat;
    kvProgressReport @11 :KvProgressReport;
    layerOwnerHello @12 :LayerOwnerHello;
    jobCancel @13 :JobCancel;
  }
}

struct JobSubmitted {
  jobId @0 :UInt64;
}

struct JobStatusList {
  jobs @0 :List(C.JobProgress);
  sidpGroups @1 :List(C.SidpGroupStatus);  # the cluster's SiDP groups and their switches
}

struct ActorList {
  actors @0 :List(C.ActorInfo);
}

struct OrchestratorReply {
  version @0 :UInt16;
  union {
    jobSubmitted @1 :JobSubmitted;
    jobStatusList @2 :JobStatusList;
    actorList @3 :ActorList;
    ack @4 :Void;
    errorReply @5 :C.ErrorReply;
  }
}
