#include "cli/sidp_status.hpp"

#include <time.h>

#include <cstdio>

namespace shardline::cli {

std::string format_unix_ms(std::uint64_t unix_ms) {
  const auto secs = static_cast<time_t>(unix_ms / 1000);
  struct tm utc {};
  gmtime_r(&secs, &utc);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<unsigned>(unix_ms % 1000));
  return buf;
}

std::string format_sidp_groups(const std::vector<messages::SidpGroupStatus>& groups) {
  std::string out;
  for (const messages::SidpGroupStatus& g : groups) {
    out += "sidp " + g.group + ": " + g.mode + " (" + g.setting;
    if (g.setting == "auto") out += ", b*=" + std::to_string(g.switch_batch);
    out += ", group batch " + std::to_string(g.group_batch) + ", " + std::to_string(g.num_ranks) + " ranks), ";
    if (g.num_switches == 0) {
      out += "no switch";
    } else {
      out += std::to_string(g.num_switches) + (g.num_switches == 1 ? " switch" : " switches");
      if (!g.switches.empty()) {
        const messages::SidpSwitchRecord& s = g.switches.back();
        out += ", last: " + s.to_mode + " at " + format_unix_ms(s.at_unix_ms) + " (batch " +
               std::to_string(s.group_batch) + ", epoch " + std::to_string(s.epoch) + ")";
      }
    }
    out += "\n";
  }
  return out;
}

nlohmann::json sidp_groups_json(const std::vector<messages::SidpGroupStatus>& groups) {
  nlohmann::json arr = nlohmann::json::array();
  for (const messages::SidpGroupStatus& g : groups) {
    nlohmann::json switches = nlohmann::json::array();
    for (const messages::SidpSwitchRecord& s : g.switches)
      switches.push_back({{"to", s.to_mode},
                          {"at_unix_ms", s.at_unix_ms},
                          {"at", format_unix_ms(s.at_unix_ms)},
                          {"group_batch", s.group_batch},
                          {"epoch", s.epoch}});
    arr.push_back({{"group", g.group},
                   {"mode", g.mode},
                   {"setting", g.setting},
                   {"num_ranks", g.num_ranks},
                   {"switch_batch", g.switch_batch},
                   {"group_batch", g.group_batch},
                   {"num_switches", g.num_switches},
                   {"switches", switches}});
  }
  return arr;
}

}  // namespace shardline::cli
