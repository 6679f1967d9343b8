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

# One canonical KV chunk (kvstore/kv_stream.hpp) of a request.
struct KvChunk {
  jobId @0 :UInt64;
  requestId @1 :UInt64;
  layerBegin @2 :Int32;
  layerEnd @3 :Int32;
  tokenBegin @4 :Int32;
  tokenEnd @5 :Int32;
  chunk @6 :Data;
}

# A request's positions [0, c) as the prefix blocks `names` the store
# keeps under `salt` (kvstore/kv_store.hpp "Prefix links"): DéjàVu's token
# streaming from the end of a cached prefix.
struct PrefixLink {
  jobId @0 :UInt64;
  requestId @1 :UInt64;
  salt @2 :UInt64;
  root @3 :UInt64;             # the first block's parent name
  names @4 :List(UInt64);      # the blocks, first first
  tokens @5 :List(Int32);      # the request's tokens at [0, c): every block's in order
}

# Store chunks (from a worker's streamer, or from a peer store replicating).
struct PutChunks {
  chunks @0 :List(KvChunk);
  fromPeer @1 :Text;       # "" from a worker; else the replicating store's name (not forwarded again)
  links @2 :List(PrefixLink);  # requests' heads as prefix blocks (acked with the chunks)
}

# The durable prefix of a request (recovery).
struct FetchPrefix {
  jobId @0 :UInt64;
  requestId @1 :UInt64;
  maxTokens @2 :Int32;
  askPeers @3 :Bool;       # when this store holds fewer tokens, ask the other stores of the ring
}

# Delete requests' KV (their lines finished), or a whole job's.
struct DropRequests {
  jobId @0 :UInt64;
  requestIds @1 :List(UInt64);  # empty = every request of the job
  fromPeer @2 :Text;            # as PutChunks.fromPeer
}

# The replication ring (orchestrator -> store); the stores' actor handles
# travel beside the signed bytes.
struct SetRing {
  names @0 :List(Text);    # every store of the cluster, in ring order
}

# A full KV block of a shared prompt prefix (issue 42's persistent prefix
# tier, kvstore/kv_store.hpp "Prefix blocks"): its name (the engine's hash
# chain), its parent's name, its token ids and its canonical chunk (all
# layers x tokens; empty in a query).
struct PrefixBlock {
  name @0 :UInt64;
  parent @1 :UInt64;
  tokens @2 :List(Int32);
  chunk @3 :Data;
}

# Keep prefix blocks a worker's prefix tier spilled; the store forwards
# them to its replica (which links need there too).
struct PutPrefixBlocks {
  salt @0 :UInt64;                # what else changes the KV (model, dtypes, layout)
  blocks @1 :List(PrefixBlock);
  fromPeer @2 :Text;              # as PutChunks.fromPeer
}

# The leading run of these blocks (chunks empty) the store keeps.
struct FetchPrefixBlocks {
  salt @0 :UInt64;
  blocks @1 :List(PrefixBlock);
}

struct KvStoreMessage {
  version @0 :UInt16;
  union {
    putBlocks @1 :PutBlocks;
    getBlocks @2 :GetBlocks;
    dropBlocks @3 :DropBlocks;
    statsQuery @4 :Void;
    putChunks @5 :PutChunks;
    fetchPrefix @6 :FetchPrefix;
    dropRequests @7 :DropRequests;
    setRing @8 :SetRing;
    putPrefixBlocks @9 :PutPrefixBlocks;
    fetchPrefixBlocks @10 :FetchPrefixBlocks;
  }
}

struct BlocksData {
  key @0 :Text;
  data @1 :Data;
  found @2 :Bool;
}

struct KvStoreStats {
  numEntries @0 :UInt64;     # chunks in the host-memory tier
  bytesUsed @1 :UInt64;      # their bytes
  bytesCapacity @2 :UInt64;  # the tier's budget
  diskBytes @3 :UInt64;      # every file of the store's RocksDB directory
  requests @4 :UInt64;       # requests with stored chunks
  chunks @5 :UInt64;         # chunks on disk
  replica @6 :Text;          # the peer replicated to ("" = none)
  lagTokens @7 :UInt64;      # positions the replica is behind the local store
  replicatedTokens @8 :UInt64;  # positions acknowledged by every replica since open
  storeName @9 :Text;
  prefixBlocks @10 :UInt64;  # prefix blocks kept (the persistent prefix tier)
  prefixBytes @11 :UInt64;   # their bytes
  prefixLinks @12 :UInt64;   # requests whose head is a prefix link
  linkedTokens @13 :UInt64;  # positions counted from links since open (their KV not sent again)
}

# A request whose prefix link waits for a block the store does not keep:
# the sender sends the block again, or the request's head as KV.
struct LinkWait {
  jobId @0 :UInt64;
  requestId @1 :UInt64;
  name @2 :UInt64;   # the block it waits for
}

# The acknowledged prefix of one request: the paper's (x, j, t).
struct KvAck {
  jobId @0 :UInt64;
  requestId @1 :UInt64;
  tokens @2 :Int32;
}

struct ChunksAcked {
  acks @0 :List(KvAck);
  waits @1 :List(LinkWait);  # the batch's requests whose prefix link waits for a block
}

struct KvPrefixData {
  tokens @0 :Int32;
  chunk @1 :Data;          # canonical chunk of all layers x [0, tokens)
  source @2 :Text;         # the store that had it
}

# The answer to putPrefixBlocks (stored: blocks newly kept) and to
# fetchPrefixBlocks (blocks: the leading run kept, with chunks).
struct PrefixBlocksData {
  blocks @0 :List(PrefixBlock);
  stored @1 :Int32;
  kept @2 :List(UInt64);          # putPrefixBlocks: the names of its blocks the store keeps after it
}

struct KvStoreReply {
  version @0 :UInt16;
  union {
    blocksData @1 :BlocksData;
    stats @2 :KvStoreStats;
    ack @3 :Void;
    errorReply @4 :C.ErrorReply;
    chunksAcked @5 :ChunksAcked;
    prefixData @6 :KvPrefixData;
    prefixBlocks @7 :PrefixBlocksData;
  }
}
