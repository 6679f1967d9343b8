# Messages the KV-store actor receives, and its replies.
@0xb9584bf27609e1cc;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("shardline::wire");

using C = import "common.capnp";

struct PutBlocks {
  key @0 :Text;
  data @1 :Data;
}

struct GetBlocks {
  key @0 :Text;
}

struct DropBlocks {
  key @0 :Text;
}

struct KvStoreMessage {
  version @0 :UInt16;
  union {
    putBlocks @1 :PutBlocks;
    getBlocks @2 :GetBlocks;
    dropBlocks @3 :DropBlocks;
    statsQuery @4 :Void;
  }
}

struct BlocksData {
  key @0 :Text;
  data @1 :Data;
  found @2 :Bool;
}

struct KvStoreStats {
  numEntries @0 :UInt64;
  bytesUsed @1 :UInt64;
  bytesCapacity @2 :UInt64;
}

struct KvStoreReply {
  version @0 :UInt16;
  union {
    blocksData @1 :BlocksData;
    stats @2 :KvStoreStats;
    ack @3 :Void;
    errorReply @4 :C.ErrorReply;
  }
}
