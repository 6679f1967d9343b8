# Messages a (GPU or CPU) worker receives, and its replies.
@0xd0bade47888eef2b;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("shardline::wire");

using C = import "common.capnp";

struct AssignWork {
  requests @0 :List(C.BatchRequest);
}

struct CancelJob {
  jobId @0 :UInt64;
}

# The orchestrator's SiDP mode directive (seed 002 §4.3 consistent mode
# switching): every rank of the group applies it at one step boundary.
struct SidpSwitch {
  group @0 :Text;          # "NODE/sidp"
  mode @1 :Text;           # "was" / "cas"
  epoch @2 :UInt64;        # increasing per cluster; older ones are ignored
}

struct WorkerMessage {
  version @0 :UInt16;
  union {
    assignWork @1 :AssignWork;
    cancelJob @2 :CancelJob;
    statusQuery @3 :Void;
    shutdown @4 :Void;
    helloAgain @5 :Void;   # the orchestrator does not know this worker (it restarted): say hello again
    sidpSwitch @6 :SidpSwitch;
  }
}

struct WorkerReply {
  version @0 :UInt16;
  union {
    status @1 :C.WorkerStatus;
    ack @2 :Void;
    errorReply @3 :C.ErrorReply;
  }
}
