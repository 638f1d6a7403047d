// Which card's measured table a launch looks in (tuned_tables.cuh has the tables' search). A table is measured on
// one card, and the best words differ between cards of one SM count (fifty-second and fifty-third sessions: the int4
// group-64 rows 1..8 re-swept on an H100 SXM were 3.3% faster there and 3.3% slower on the H200, whose HBM is 1.47x
// faster). A kernel may ship a table for each card (kCards); a launch looks
// in the table of the card it runs on: the card of its SM count whose peak memory bandwidth (clock x bus width) is
// nearest, by ratio, to the device's, else none (the rules alone). A kernel without a table of that card uses its
// H200 table (the card its tables were first measured on). DSX_TUNED_CARD=h200 / h100 in the environment (read
// once) or dsx_tuned_card_cuda at any time makes every device look like that card (the tests check each table's
// entries on one GPU; host-only harnesses, without a device, take the H200's).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace dsx_cuda {

// The cards tables are measured on (dsx.h: dsx_tuned_card_cuda's codes).
enum TunedCard : int { kCardByDevice = 0, kCardH200 = 1, kCardH100 = 2, kCardNone = 3 };
struct CardSpec {
  int card, sms, gbs;  // peak memory bandwidth, GB/s: 2 x memory clock x bus width
  const char* env;     // DSX_TUNED_CARD's word for it
};
constexpr CardSpec kCards[] = {{kCardH200, 132, 4915, "h200"},   // 3201 MHz x 6144 bits (H200 SXM, 141 GB)
                               {kCardH100, 132, 3352, "h100"}};  // 2619 MHz x 5120 bits (H100 SXM, 80 GB)

// The card a device of `sms` SMs and `gbs` GB/s is: the one of its SM count whose bandwidth is nearest by ratio (an
// H100 NVL's 3.9 TB/s: the H100's), kCardNone if no card has its SM count; gbs <= 0 (not known): the first of them.
constexpr int card_of(int sms, int gbs) {
  int best = kCardNone;
  double dist = 0;
  for (const CardSpec& c : kCards) {
    if (c.sms != sms) continue;
    if (gbs <= 0) return c.card;
    const double r = c.gbs > gbs ? double(c.gbs) / gbs : double(gbs) / c.gbs;
    if (best == kCardNone || r < dist) best = c.card, dist = r;
  }
  return best;
}

// The forced card (kCardByDevice: none), first from DSX_TUNED_CARD (h200 / h100; anything else: by device).
inline std::atomic<int>& tuned_card_forced() {
  static std::atomic<int> forced{[] {
    const char* e = std::getenv("DSX_TUNED_CARD");
    for (const CardSpec& c : kCards)
      if (e && std::strcmp(e, c.env) == 0) return c.card;
    return int(kCardByDevice);
  }()};
  return forced;
}

// card kCardByDevice / kCardH200 / kCardH100: force it (kCardByDevice: none) for the process; -1: only ask. The
// setting before the call, or -1 for a card that is none of those.
inline int tuned_card_switch(int card) {
  if (card < -1 || card > kCardH100) return -1;
  return card == -1 ? tuned_card_forced().load() : tuned_card_forced().exchange(card);
}

// The card of the current device (cached a device ordinal), judged with `sms` (the caller's query of its SM count);
// a forced card wins. Without a device to ask (host-only harnesses): by the SM count alone.
inline int tuned_card(int sms) {
  if (const int f = tuned_card_forced().load(std::memory_order_relaxed)) return f;
  static std::atomic<int> cache[64] = {};  // card + 1 a device ordinal, 0: not asked yet
  int dev = -1, clock = 0, bus = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
    cudaGetLastError();
    return card_of(sms, 0);
  }
  if (dev < 64)
    if (const int c = cache[dev].load(std::memory_order_relaxed)) return c - 1;
  int gbs = 0;
  if (cudaDeviceGetAttribute(&clock, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
    gbs = static_cast<int>(std::lround(2.0 * clock * 1e3 * bus / 8 / 1e9));
  else
    cudaGetLastError();
  const int card = card_of(sms, gbs);
  if (dev < 64) cache[dev].store(card + 1, std::memory_order_relaxed);
  return card;
}

}  // namespace dsx_cuda
