#pragma once
/// \file
/// Sub-group communicators: a Communicator for a subset of a parent group's
/// ranks (e.g. the tensor-parallel and sequence-parallel groups inside a TCP
/// world group), built only on the parent's point-to-point send / recv, so it
/// works over any backend whose sends do not wait for the matching recv
/// (in-process, TCP).
///
///   // world 4: TP groups {0,1} and {2,3}, SP groups {0,2} and {1,3}
///   auto tp = make_subgroup(world, {r & ~1, r | 1}, 1 << 24).value();
///   auto sp = make_subgroup(world, {r & 1, (r & 1) + 2}, 2 << 24).value();
///
/// Ranks: sub-group rank i is parent rank members[i]. Every member calls
/// make_subgroup with the same members (in the same order) and tag_base.
///
/// Tags: a sub-group uses the parent tags [tag_base, tag_base +
/// kSubgroupTagSpan): tag_base + 0..2 carry its collectives (a 48-byte
/// descriptor, then the payload), tag_base + 16 + t carries its user tag t
/// (0 <= t <= kSubgroupMaxTag). Sub-groups of one parent that share a member
/// need disjoint ranges (e.g. tag_base = 1 << 24, 2 << 24, ...), and the
/// parent's own point-to-point traffic must stay outside them. Region names
/// are prefixed with "sg<tag_base>:" in the parent, so sub-groups do not see
/// each other's regions.
///
/// Collectives are the direct exchanges of comm/exchange.hpp: deterministic
/// rank-order sums, bit-identical to the in-process backend, same argument
/// checks (ranks that disagree all get invalid_argument). Each call is bounded
/// by the sub-group's timeout (set_timeout; starts as the parent's): before
/// every call on the parent the sub-group sets the parent's timeout to the
/// time left, and restores it afterwards — so the parent and its sub-groups
/// must be used by one thread at a time on each rank. A collective that fails
/// with io poisons the sub-group (later collectives fail with io at once;
/// rebuild it), as over TCP; point to point and get keep working.
///
/// The parent must outlive the sub-group. The sub-group withdraws the regions
/// it exposed when destroyed. bytes_sent() counts the payloads this
/// sub-group sent (not the descriptors, nor get answers, which the parent's
/// own counter sees).

#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "common/result.hpp"

namespace shardline::comm {

/// Parent tags one sub-group uses, from its tag_base.
inline constexpr int kSubgroupTagSpan = 1 << 20;
/// Tags reserved for a sub-group's own collectives, at the start of its span.
inline constexpr int kSubgroupInternalTags = 16;
/// Largest user tag a sub-group's send / recv accept.
inline constexpr int kSubgroupMaxTag = kSubgroupTagSpan - kSubgroupInternalTags - 1;

/// How make_subgroup takes the order of `members`.
enum class MemberOrder {
  increasing,  ///< members must be strictly increasing (sub-group ranks follow parent ranks)
  /// Any order without duplicates: sub-group rank i is members[i], so the
  /// sub-group's rank order (and its collectives' summation order) may
  /// differ from the parent's — e.g. the Shift Parallelism TP group in the
  /// SP_TP head order {0, 2, 1, 3} of seed 001 §3.3.1.
  as_given,
};

/// The sub-group of `parent` made of the parent ranks `members` (each in
/// [0, parent.world_size()), including parent.rank(); strictly increasing
/// unless `order` is as_given). tag_base must be in [0, INT_MAX -
/// kSubgroupTagSpan + 1]. Sends nothing.
/// Errors: invalid_argument (members empty, duplicated, out of range,
/// unsorted under MemberOrder::increasing, or without this rank; tag_base
/// out of range).
[[nodiscard]] Result<std::unique_ptr<Communicator>> make_subgroup(
    Communicator& parent, std::vector<int> members, int tag_base,
    MemberOrder order = MemberOrder::increasing);

}  // namespace shardline::comm
