# Structs shared by the per-actor schemas (orchestrator, worker, kvstore).
# Mirrors of the plain C++ structs in orchestrator/batch_types.hpp,
# engine/sampling_params.hpp and messages/types.hpp; the codec
# (messages/codec.cpp) converts between the two.
#
# Evolution rules: only add fields (next ordinal), never renumber, retype or
# remove; bump kSchemaVersion (messages/types.hpp) on incompatible changes.
# Defaults equal the C++ defaults so that a field a sender does not know
# about reads as the C++ default.
@0x82eac8c0e5288e0b;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("shardline::wire");

# shardline::ErrorCode, same order.
enum ErrorCode {
  invalidArgument @0;
  notFound @1;
  unsupported @2;
  corrupt @3;
  mismatch @4;
  outOfMemory @5;
  io @6;
  internal @7;
  diskFull @8;
}

# A request was refused / failed (any actor's reply).
struct ErrorReply {
  code @0 :ErrorCode = internal;
  message @1 :Text;
}

# engine::SamplingParams.
struct SamplingParams {
  temperature @0 :Float32 = 1.0;
  topK @1 :Int32 = 0;
  topP @2 :Float32 = 1.0;
  minP @3 :Float32 = 0.0;
  repetitionPenalty @4 :Float32 = 1.0;
  presencePenalty @5 :Float32 = 0.0;
  frequencyPenalty @6 :Float32 = 0.0;
  seed @7 :UInt64;
  hasSeed @8 :Bool;
  maxTokens @9 :Int32 = 16;
  minTokens @10 :Int32 = 0;
  ignoreEos @11 :Bool;
  stopTokenIds @12 :List(Int32);
  stop @13 :List(Text);
  logprobs @14 :Int32 = -1;   # top logprobs per generated token; -1 = none
}

# worker::BatchRequest: one input line.
struct BatchRequest {
  jobId @0 :UInt64;
  lineIndex @1 :UInt64;
  customId @2 :Text;
  prompt @3 :Text;
  promptTokenIds @4 :List(Int32);
  params @5 :SamplingParams;
  returnTokenIds @6 :Bool;
  n @7 :Int32 = 1;
  tokenBudget @8 :Text;    # the job's token budget policy ("fixed", "throttle"); "" = fixed
  resume @9 :List(ChoiceResume);  # [n] when the line resumes after a failure; empty for a fresh line
  chat @10 :Bool;                 # a /v1/chat/completions line
  messagesJson @11 :Text;         # chat: the messages, a JSON array
  chatTemplateKwargsJson @12 :Text;  # chat: a JSON object; "" = none
  addGenerationPrompt @13 :Bool = true;
  chatTemplate @14 :Text;         # the job's --chat-template text; "" = the model folder's
  maxTokensFromContext @15 :Bool; # chat without max_tokens: up to the context's end
  echo @16 :Bool;                 # completions echo
  grammarKind @17 :Text;          # structured outputs: "json_schema", "json_object", "regex", "choice", "ebnf"; "" = none
  grammarText @18 :Text;          # the schema, regex or grammar
  grammarChoices @19 :List(Text); # "choice": the allowed outputs
  grammarAnyWhitespace @20 :Bool = true;
}

# worker::ChoiceResume without its KV (the worker fetches that from a KV store).
struct ChoiceResume {
  outputIds @0 :List(Int32);
  numKvTokens @1 :Int32;
}

# worker::KvProgress: a choice's replicated progress (worker -> orchestrator).
struct KvProgress {
  jobId @0 :UInt64;
  lineIndex @1 :UInt64;
  choice @2 :Int32;
  replicatedTokens @3 :Int32;
  outputIds @4 :List(Int32);
}

# worker::BatchChoice.
struct BatchChoice {
  index @0 :Int32;
  text @1 :Text;
  finishReason @2 :Text;
  tokenIds @3 :List(Int32);
  logprobs @4 :List(ChoiceTokenLogprobs);  # [generated tokens] when asked for
}

# worker::TokenLogprobText.
struct TokenLogprobText {
  token @0 :Text;
  bytes @1 :Data;
  logprob @2 :Float32;
}

# worker::ChoiceTokenLogprobs.
struct ChoiceTokenLogprobs {
  sampled @0 :TokenLogprobText;
  top @1 :List(TokenLogprobText);
  textOffset @2 :Int32;
}

# worker::BatchResult: the result of one input line.
struct BatchResult {
  jobId @0 :UInt64;
  lineIndex @1 :UInt64;
  customId @2 :Text;
  ok @3 :Bool;
  choices @4 :List(BatchChoice);
  promptTokens @5 :Int32;
  completionTokens @6 :Int32;
  errorCode @7 :Text;
  errorMessage @8 :Text;
  chat @9 :Bool;                 # a chat.completion
  logprobs @10 :Int32 = -1;      # top logprobs asked for; -1 = none
  cachedTokens @11 :Int32;       # prompt tokens the first choice found in the prefix cache
}

# Progress of one job (orchestrator -> client).
struct JobProgress {
  jobId @0 :UInt64;
  state @1 :Text;
  total @2 :UInt64;
  done @3 :UInt64;
  failed @4 :UInt64;
  promptTokens @5 :UInt64;
  completionTokens @6 :UInt64;
  tokensPerS @7 :Float64;
  etaS @8 :Float64;
  output @9 :Text;
  inputs @10 :List(Text);  # the job's shards, in order
  parallel @11 :Text;      # the job's parallel config, "tp=2,pp=1,sp=1,dp=1"; "" = not recorded
  tokenBudget @12 :Text;   # the job's token budget policy
  requeued @13 :UInt64;    # lines handed back because their worker failed (this process)
  resumed @14 :UInt64;     # lines handed out again with replicated KV to resume from (this process)
  error @15 :Text;         # why it failed, or why an unfinished job is held back; "" = nothing to say
  paused @16 :Text;        # why a write failed and the job waits to retry it ("disk_full: ..."); "" = not paused
  cachedTokens @17 :UInt64;  # prompt tokens the workers found in their prefix caches
  prefixOrdered @18 :Bool;   # lines go out in prefix-aware order
  prefixIdealHitRate @19 :Float64;  # the prompts' prefix tree's share of their text (0..1)
}

# A worker's state (worker -> orchestrator, worker -> client).
struct WorkerStatus {
  workerName @0 :Text;
  device @1 :Text;
  state @2 :Text;
  numRunning @3 :UInt32;
  numWaiting @4 :UInt32;
  kvBlocksUsed @5 :UInt64;
  kvBlocksTotal @6 :UInt64;
  promptTokens @7 :UInt64;
  generatedTokens @8 :UInt64;
  stepsDone @9 :UInt64;
  weightBytes @10 :UInt64;  # bytes of weights the worker's devices hold (SiDP: attention + owned FFN + slots)
  sidpMode @11 :Text;       # the mode its SiDP rank runs in now, "was" / "cas"; "" = not SiDP
  seesawPhase @12 :Text;    # Seesaw: "prefill" / "decode" now; "" = no phases
  seesawTransitions @13 :UInt64;  # Seesaw: phase transitions so far
}

# One WaS <-> CaS switch of a SiDP group (orchestrator -> client).
struct SidpSwitchRecord {
  toMode @0 :Text;         # "was" / "cas"
  atUnixMs @1 :UInt64;     # when the orchestrator broadcast it (wall clock, ms since 1970)
  groupBatch @2 :UInt64;   # the group's effective batch when it decided
  epoch @3 :UInt64;        # the epoch broadcast with it
}

# The switching state of one SiDP DP group (orchestrator -> client).
struct SidpGroupStatus {
  group @0 :Text;          # "NODE/sidp"
  mode @1 :Text;           # "was" / "cas": the mode last broadcast
  setting @2 :Text;        # "auto" / "was" / "cas"
  numRanks @3 :UInt32;
  switchBatch @4 :UInt64;  # b*: threshold on the group's effective batch
  groupBatch @5 :UInt64;   # the group's effective batch at the last report
  switches @6 :List(SidpSwitchRecord);  # oldest first (the last 64)
  numSwitches @7 :UInt64;  # all of them, also those no longer listed
}

# One actor of the system (orchestrator -> client).
struct ActorInfo {
  name @0 :Text;
  kind @1 :Text;
  node @2 :Text;
  state @3 :Text;
  parallel @4 :Text;       # a worker's engine group, "tp=2,pp=1,sp=1"; "" for other actors
  detail @5 :Text;         # what else its kind reports (a KV store: bytes in memory and on disk, replication lag)
}
