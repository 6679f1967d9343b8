#pragma once
// Sample messages with non-trivial content for the codec tests, and field-wise
// comparisons for the structs that have no operator== (expect_msg_eq compares
// two messages of any variant).

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "messages/codec.hpp"

namespace shardline::messages::testing {

inline sampling::SamplingParams sample_params(int salt) {
  sampling::SamplingParams p;
  p.temperature = 0.7f + 0.01f * static_cast<float>(salt);
  p.top_k = 40 + salt;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = -0.5f;
  p.frequency_penalty = 1.25f;
  p.seed = 0xDEADBEEFCAFEF00Dull + static_cast<std::uint64_t>(salt);
  p.has_seed = (salt % 2) == 0;
  p.max_tokens = 128 + salt;
  p.min_tokens = 3;
  p.ignore_eos = (salt % 3) == 0;
  p.stop_token_ids = {2, 13, 32000 + salt};
  p.stop = {"\n\n", "</s>", std::string("nul\0inside", 10), "ünïcödé ✓"};
  return p;
}

inline worker::BatchRequest sample_request(int i) {
  worker::BatchRequest r;
  r.job_id = 7;
  r.line_index = 1000000000000ull + static_cast<std::uint64_t>(i);
  r.custom_id = "req-" + std::to_string(i);
  if (i % 2 == 0) {
    r.prompt = "Once upon a time, line " + std::to_string(i) + " with \"quotes\" and\ttabs";
  } else {
    r.prompt_token_ids = {1, 15043, 29892, 3186, i};
  }
  r.params = sample_params(i);
  r.return_token_ids = (i % 2) == 1;
  r.n = 1 + i % 3;
  if (i % 2 == 1)  // a requeued line resuming from replicated KV (no chunk: the worker fetches it)
    for (int c = 0; c < r.n; ++c) r.resume.push_back({{100 + c, 200 + i, 3}, 17 + c, {}});
  if (i % 3 == 1) {  // a chat line
    r.chat = true;
    r.messages_json = R"([{"role":"system","content":"Be brief ✓"},{"role":"user","content":"Hi )" +
                      std::to_string(i) + R"("}])";
    r.chat_template_kwargs_json = R"({"enable_thinking":false})";
    r.add_generation_prompt = i % 2 == 0;
    r.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
    r.max_tokens_from_context = true;
  }
  r.echo = i % 4 == 2;
  r.params.logprobs = i % 5 - 1;
  if (i % 4 == 1) {  // a structured output
    r.grammar_kind = i % 8 == 1 ? "json_schema" : "choice";
    r.grammar_text = i % 8 == 1 ? R"({"type": "object", "properties": {"✓": {"type": "integer"}}})" : "";
    if (i % 8 != 1) r.grammar_choices = {"yes", "no \"really\"", ""};
    r.grammar_any_whitespace = i % 3 == 0;
  }
  return r;
}

inline worker::BatchResult sample_result(int i) {
  worker::BatchResult r;
  r.job_id = 7;
  r.line_index = static_cast<std::uint64_t>(i);
  r.custom_id = "req-" + std::to_string(i);
  if (i % 3 == 2) {
    r.ok = false;
    r.error_code = "context_length_exceeded";
    r.error_message = "prompt has 5000 tokens, the context is 4096";
  } else {
    r.ok = true;
    for (int c = 0; c < 1 + i % 3; ++c) {
      worker::BatchChoice ch;
      ch.index = c;
      ch.text = " there was a little robot #" + std::to_string(c);
      ch.finish_reason = c % 2 ? "length" : "stop";
      ch.token_ids = {727, 471, 263, c, 2};
      if (i % 2 == 0)
        for (int t = 0; t < 2; ++t)
          ch.logprobs.push_back({{"\xEF\xBF\xBD", std::string("\xE2\x9C", 2), -0.25f * static_cast<float>(t + 1)},
                                 {{" there", " there", -0.5f}, {"\n", "\n", -9999.0f}},
                                 3 * t});
      r.choices.push_back(ch);
    }
    r.prompt_tokens = 12 + i;
    r.completion_tokens = 5 * static_cast<int>(r.choices.size());
    r.cached_tokens = i % 2 == 0 ? 8 : 0;
    r.chat = i % 2 == 1;
    r.logprobs = i % 2 == 0 ? 2 : -1;
  }
  return r;
}

inline WorkerStatus sample_status() {
  WorkerStatus s;
  s.worker_name = "worker-gpu-0@node-a";
  s.device = "cuda:0";
  s.state = "busy";
  s.num_running = 48;
  s.num_waiting = 1023;
  s.kv_blocks_used = 3071;
  s.kv_blocks_total = 4096;
  s.prompt_tokens = 123456789012ull;
  s.generated_tokens = 98765432109ull;
  s.steps_done = 4000000000ull;
  s.weight_bytes = 5ull << 30;
  s.sidp_mode = "cas";
  s.seesaw_phase = "decode";
  s.seesaw_transitions = 1234567;
  return s;
}

inline SidpGroupStatus sample_sidp_group() {
  SidpGroupStatus g;
  g.group = "node-a/sidp";
  g.mode = "cas";
  g.setting = "auto";
  g.num_ranks = 4;
  g.switch_batch = 37;
  g.group_batch = 5;
  g.switches = {{"cas", 1795000000123ull, 30, 1}, {"was", 1795000004567ull, 60, 2}, {"cas", 1795000009000ull, 12, 3}};
  g.num_switches = 3;
  return g;
}

inline JobProgress sample_progress(int i) {
  JobProgress p;
  p.job_id = 100 + static_cast<std::uint64_t>(i);
  p.state = i % 2 ? "running" : "done";
  p.total = 50000;
  p.done = 12345 + static_cast<std::uint64_t>(i);
  p.failed = 17;
  p.prompt_tokens = 1u << 30;
  p.completion_tokens = 3u << 29;
  p.tokens_per_s = 1234.5 + i;
  p.eta_s = 98.25;
  p.output = "/data/out/job-" + std::to_string(i) + ".jsonl";
  p.inputs = {"/data/in/a-" + std::to_string(i) + ".jsonl", "/data/in/b.jsonl"};
  p.requeued = 3 + static_cast<std::uint64_t>(i);
  p.resumed = 2;
  if (i % 2 == 0) p.error = "job " + std::to_string(p.job_id) + " was started on another model";
  return p;
}

inline std::string binary_blob(std::size_t n, std::uint32_t seed) {
  std::string s(n, '\0');
  std::uint32_t x = seed;
  for (auto& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

// ---- comparisons -------------------------------------------------------------

inline void expect_params_eq(const sampling::SamplingParams& a, const sampling::SamplingParams& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.has_seed, b.has_seed);
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.min_tokens, b.min_tokens);
  EXPECT_EQ(a.ignore_eos, b.ignore_eos);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.logprobs, b.logprobs);
}

inline void expect_request_eq(const worker::BatchRequest& a, const worker::BatchRequest& b) {
  EXPECT_EQ(a.job_id, b.job_id);
  EXPECT_EQ(a.line_index, b.line_index);
  EXPECT_EQ(a.custom_id, b.custom_id);
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_EQ(a.prompt_token_ids, b.prompt_token_ids);
  expect_params_eq(a.params, b.params);
  EXPECT_EQ(a.return_token_ids, b.return_token_ids);
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.token_budget, b.token_budget);
  ASSERT_EQ(a.resume.size(), b.resume.size());
  for (std::size_t i = 0; i < a.resume.size(); ++i) {
    EXPECT_EQ(a.resume[i].output_ids, b.resume[i].output_ids);
    EXPECT_EQ(a.resume[i].num_kv_tokens, b.resume[i].num_kv_tokens);
  }
  EXPECT_EQ(a.chat, b.chat);
  EXPECT_EQ(a.messages_json, b.messages_json);
  EXPECT_EQ(a.chat_template_kwargs_json, b.chat_template_kwargs_json);
  EXPECT_EQ(a.add_generation_prompt, b.add_generation_prompt);
  EXPECT_EQ(a.chat_template, b.chat_template);
  EXPECT_EQ(a.max_tokens_from_context, b.max_tokens_from_context);
  EXPECT_EQ(a.echo, b.echo);
  EXPECT_EQ(a.grammar_kind, b.grammar_kind);
  EXPECT_EQ(a.grammar_text, b.grammar_text);
  EXPECT_EQ(a.grammar_choices, b.grammar_choices);
  EXPECT_EQ(a.grammar_any_whitespace, b.grammar_any_whitespace);
}

inline void expect_result_eq(const worker::BatchResult& a, const worker::BatchResult& b) {
  EXPECT_EQ(a.job_id, b.job_id);
  EXPECT_EQ(a.line_index, b.line_index);
  EXPECT_EQ(a.custom_id, b.custom_id);
  EXPECT_EQ(a.ok, b.ok);
  ASSERT_EQ(a.choices.size(), b.choices.size());
  for (std::size_t i = 0; i < a.choices.size(); ++i) {
    EXPECT_EQ(a.choices[i].index, b.choices[i].index);
    EXPECT_EQ(a.choices[i].text, b.choices[i].text);
    EXPECT_EQ(a.choices[i].finish_reason, b.choices[i].finish_reason);
    EXPECT_EQ(a.choices[i].token_ids, b.choices[i].token_ids);
    EXPECT_EQ(a.choices[i].logprobs, b.choices[i].logprobs);
  }
  EXPECT_EQ(a.chat, b.chat);
  EXPECT_EQ(a.logprobs, b.logprobs);
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  EXPECT_EQ(a.completion_tokens, b.completion_tokens);
  EXPECT_EQ(a.cached_tokens, b.cached_tokens);
  EXPECT_EQ(a.error_code, b.error_code);
  EXPECT_EQ(a.error_message, b.error_message);
}

/// One alternative's content: operator== where the struct has one, else
/// field-wise.
template <class T>
void expect_same(const T& a, const T& b) {
  EXPECT_EQ(a, b);
}

inline void expect_same(const Error& a, const Error& b) {
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.message, b.message);
}

inline void expect_same(const WorkerResults& a, const WorkerResults& b) {
  EXPECT_EQ(a.worker_name, b.worker_name);
  ASSERT_EQ(a.results.size(), b.results.size());
  for (std::size_t i = 0; i < a.results.size(); ++i) expect_result_eq(a.results[i], b.results[i]);
}

inline void expect_same(const AssignWork& a, const AssignWork& b) {
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (std::size_t i = 0; i < a.requests.size(); ++i) expect_request_eq(a.requests[i], b.requests[i]);
}

/// The same alternative with the same content.
template <class... Ts>
void expect_msg_eq(const std::variant<Ts...>& a, const std::variant<Ts...>& b) {
  ASSERT_EQ(a.index(), b.index()) << kind_name(a) << " vs " << kind_name(b);
  std::visit([&b](const auto& x) { expect_same(x, std::get<std::decay_t<decltype(x)>>(b)); }, a);
}

inline std::vector<std::byte> sample_chunk(std::size_t n, std::uint32_t seed) {
  const std::string b = binary_blob(n, seed);
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>(b[i]);
  return out;
}

inline KvStoreStats sample_kv_stats() {
  KvStoreStats s;
  s.num_entries = 40;
  s.bytes_used = 3u << 20;
  s.bytes_capacity = 256u << 20;
  s.disk_bytes = 9u << 20;
  s.requests = 17;
  s.chunks = 300;
  s.replica = "node-b/kvstore";
  s.lag_tokens = 12;
  s.replicated_tokens = 1u << 20;
  s.store_name = "node-a/kvstore";
  s.prefix_blocks = 63;
  s.prefix_links = 5;
  s.linked_tokens = 4096;
  s.prefix_bytes = 63u * 73728u * 16u;
  return s;
}

// ---- every kind of every message, encoded ------------------------------------

inline std::vector<OrchestratorMsg> sample_orchestrator_msgs() {
  std::vector<worker::BatchResult> results;
  for (int i = 0; i < 6; ++i) results.push_back(sample_result(i));
  return {
      OrchestratorMsg{SubmitJob{"/models/stories15M",
                                    {"/data/in/shard-000.jsonl", "/data/in/shard-001.jsonl", ""},
                                    "/data/out/result.jsonl", std::nullopt, "", "",
                                    "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}", true}},
      OrchestratorMsg{JobStatusQuery{42}},
      OrchestratorMsg{JobStatusQuery{0}},
      OrchestratorMsg{JobCancel{7}},
      OrchestratorMsg{ActorListQuery{}},
      OrchestratorMsg{KillActor{"worker-gpu-1@node-b"}},
      OrchestratorMsg{WorkerHello{"worker-gpu-0@node-a", "cuda:0", 256, engine::ParallelConfig{}}},
      OrchestratorMsg{WorkerHello{"worker-gpu-0@node-a",
                                  "cuda:0",
                                  256,
                                  engine::ParallelConfig{},
                                  {{7, 0}, {7, 1000000000000ull}, {0xFFFFFFFFFFFFFFFFull, 3}}}},
      OrchestratorMsg{WorkerResults{"worker-gpu-0@node-a", results}},
      OrchestratorMsg{WorkerHeartbeat{"worker-gpu-0@node-a", sample_status()}},
      OrchestratorMsg{Shutdown{}},
      OrchestratorMsg{KvStoreHello{"node-b/kvstore", "node-b"}},
      OrchestratorMsg{KvStoreHeartbeat{sample_kv_stats()}},
      OrchestratorMsg{KvProgressReport{"node-a/cpu:0", {{7, 12, 0, 130, {5, 6, 7}}, {7, 12, 1, 3, {}}}}},
      OrchestratorMsg{WorkerHello{"node-a/cpu:1", "cpu", 64, engine::ParallelConfig{}, {}, "node-a/sidp", 1, 4}},
      OrchestratorMsg{LayerOwnerHello{"node-a/cpu:1/owner", "node-a", "node-a/sidp", 1, {1, 5, 9}, 3u << 20, true, 2}},
      OrchestratorMsg{LayerOwnerHello{"node-a/cpu:0/owner", "node-a", "node-a/sidp", 0, {}, 0, false, 0}},
  };
}

inline std::vector<OrchestratorReply> sample_orchestrator_replies() {
  return {
      OrchestratorReply{JobSubmitted{0xFFFFFFFFFFFFFFFEull}},
      OrchestratorReply{JobStatusList{{sample_progress(0), sample_progress(1), sample_progress(2)}}},
      OrchestratorReply{JobStatusList{}},
      OrchestratorReply{JobStatusList{{sample_progress(0)}, {sample_sidp_group(), SidpGroupStatus{"b/sidp", "was", "was", 2, 0, 0, {}, 0}}}},
      OrchestratorReply{ActorList{{{"orchestrator", "orchestrator", "node-a", "up", ""},
                                       {"worker-gpu-0", "worker", "node-a", "busy", "tp=2,pp=1,sp=1"},
                                       {"kvstore", "kvstore", "node-b", "up", "", "mem 1.0 MiB / 256 MiB, disk 2.0 MiB"}}}},
      OrchestratorReply{Ack{}},
      OrchestratorReply{Error{ErrorCode::not_found, "no job with id 99"}},
  };
}

inline std::vector<WorkerMsg> sample_worker_msgs() {
  std::vector<worker::BatchRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(sample_request(i));
  return {
      WorkerMsg{AssignWork{reqs}},
      WorkerMsg{AssignWork{}},
      WorkerMsg{CancelJob{12345}},
      WorkerMsg{WorkerStatusQuery{}},
      WorkerMsg{Shutdown{}},
      WorkerMsg{HelloAgain{}},
      WorkerMsg{SidpSwitch{"node-a/sidp", "cas", 1}},
      WorkerMsg{SidpSwitch{"node-a/sidp", "was", 0xFFFFFFFFull}},
  };
}

inline std::vector<WorkerReply> sample_worker_replies() {
  return {
      WorkerReply{sample_status()},
      WorkerReply{Ack{}},
      WorkerReply{Error{ErrorCode::out_of_memory, "KV cache: 4096 blocks needed, 1024 free"}},
  };
}

inline std::vector<KvStoreMsg> sample_kvstore_msgs() {
  return {
      KvStoreMsg{PutBlocks{"job7/seq3/blocks0-15", binary_blob(4096 + 3, 1)}},
      KvStoreMsg{GetBlocks{"job7/seq3/blocks0-15"}},
      KvStoreMsg{DropBlocks{"job7/seq3"}},
      KvStoreMsg{StatsQuery{}},
      KvStoreMsg{PutChunks{{{{7, 1793, {0, 6, 0, 9}}, sample_chunk(6 * 2 * 9 * 8, 4)},
                            {{7, 1794, {2, 3, 130, 131}}, sample_chunk(2 * 8, 5)}},
                           ""}},
      KvStoreMsg{PutChunks{{}, "node-a/kvstore"}},
      KvStoreMsg{PutChunks{{{{7, 1795, {0, 6, 8, 9}}, sample_chunk(6 * 2 * 1 * 8, 8)}},
                           "",
                           {{7, 1795, 0x5a17, 0x2007, {11, 12}, {1, 2, 3, 4, 5, 6, 7, 8}},
                            {7, 1796, 0x5a17, 0x2007, {11}, {1, 2, 3, 4}}}}},
      KvStoreMsg{FetchPrefix{7, 1793, 512, true}},
      KvStoreMsg{DropRequests{7, {1793, 1794}, ""}},
      KvStoreMsg{DropRequests{7, {}, "node-a/kvstore"}},
      KvStoreMsg{SetRing{{"a/kvstore", "b/kvstore"}}},
      KvStoreMsg{PutPrefixBlocks{0x1234'5678'9abc'def0ull, {{11, 10, {1, 2, 3, 4}, sample_chunk(6 * 2 * 4 * 8, 5)},
                                                           {12, 11, {5, 6, 7, 8}, sample_chunk(6 * 2 * 4 * 8, 6)}}}},
      KvStoreMsg{FetchPrefixBlocks{7, {{11, 10, {1, 2, 3, 4}, {}}}}},
      KvStoreMsg{PutPrefixBlocks{7, {}}},
      KvStoreMsg{PutPrefixBlocks{7, {{11, 10, {1, 2, 3, 4}, sample_chunk(6 * 2 * 4 * 8, 9)}}, "node-a/kvstore"}},
  };
}

inline std::vector<KvStoreReply> sample_kvstore_replies() {
  return {
      KvStoreReply{BlocksData{"job7/seq3/blocks0-15", binary_blob(777, 2), true}},
      KvStoreReply{BlocksData{"missing", "", false}},
      KvStoreReply{KvStoreStats{12, 1u << 30, 8ull << 30}},
      KvStoreReply{sample_kv_stats()},
      KvStoreReply{ChunksAcked{{{7, 1793, 9}, {7, 1794, 0}}, {}}},
      KvStoreReply{ChunksAcked{{{7, 1795, 4}}, {{7, 1795, 0xfeedull}}}},
      KvStoreReply{KvPrefixData{9, sample_chunk(6 * 2 * 9 * 8, 6), "node-b/kvstore"}},
      KvStoreReply{KvPrefixData{0, {}, ""}},
      KvStoreReply{PrefixBlocksData{{{11, 10, {1, 2, 3, 4}, sample_chunk(6 * 2 * 4 * 8, 7)}}, 0}},
      KvStoreReply{PrefixBlocksData{{}, 2}},
      KvStoreReply{PrefixBlocksData{{}, 1, {11, 12}}},
      KvStoreReply{Ack{}},
      KvStoreReply{Error{ErrorCode::io, "rocksdb: disk full"}},
  };
}

/// Encoded samples of all six message types.
inline std::vector<std::string> all_encoded_samples() {
  std::vector<std::string> out;
  for (const auto& m : sample_orchestrator_msgs()) out.push_back(encode(m));
  for (const auto& m : sample_orchestrator_replies()) out.push_back(encode(m));
  for (const auto& m : sample_worker_msgs()) out.push_back(encode(m));
  for (const auto& m : sample_worker_replies()) out.push_back(encode(m));
  for (const auto& m : sample_kvstore_msgs()) out.push_back(encode(m));
  for (const auto& m : sample_kvstore_replies()) out.push_back(encode(m));
  return out;
}

/// Runs every decoder on `bytes`. Each must return a value or an Error (a
/// crash or escaping exception fails the test binary); decoded values must
/// re-encode and decode again. Returns how many decoders accepted.
inline int decode_with_all(std::string_view bytes) {
  int accepted = 0;
  auto check = [&](auto result, auto redecode) {
    if (result.ok()) {
      ++accepted;
      auto again = redecode(encode(result.value()));
      EXPECT_TRUE(again.ok()) << again.error().to_string();
    } else {
      EXPECT_FALSE(result.error().message.empty());
    }
  };
  check(decode_orchestrator(bytes), [](std::string_view b) { return decode_orchestrator(b); });
  check(decode_orchestrator_reply(bytes), [](std::string_view b) { return decode_orchestrator_reply(b); });
  check(decode_worker(bytes), [](std::string_view b) { return decode_worker(b); });
  check(decode_worker_reply(bytes), [](std::string_view b) { return decode_worker_reply(b); });
  check(decode_kvstore(bytes), [](std::string_view b) { return decode_kvstore(b); });
  check(decode_kvstore_reply(bytes), [](std::string_view b) { return decode_kvstore_reply(b); });
  return accepted;
}

}  // namespace shardline::messages::testing
