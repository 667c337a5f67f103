// The MPI tags of pyshard's point-to-point messages, in one table. Each kind of message has
// its own, so that messages of steps that may be in flight at once on one communicator are
// never matched with each other (every communicator is the core's own duplicate, so no
// other library's messages meet these).
#pragma once

namespace pyshard::tags {

// An exchange's point-to-point messages (the p2p algorithm, ExchangeStep::run).
constexpr int kExchange = 7;
// A halo exchange's messages. The halo step takes its tag from Python: pyshard/halo.py's
// HALO_TAG, which is _core.HALO_TAG, this value.
constexpr int kHalo = 8;
// An exchange in flight (redistribute(..., wait=False): ExchangeStep::start/complete):
// never matched with a blocking step's messages.
constexpr int kPending = 9;
// A halo fold's messages (the reverse exchange, HaloArray.fold): pyshard/halo.py's FOLD_TAG,
// which is _core.FOLD_TAG, this value (a fold and a pending exchange may be in flight at once).
constexpr int kFold = 10;
// migrate's messages (cpp/migrate.cpp): the counts (NBX or to the given peers), the rows,
// and the rows going back (Migrated.back), each its own so a pending migration's messages
// never meet the next call's.
constexpr int kMigrateCount = 11;
constexpr int kMigrateRows = 12;
constexpr int kMigrateBack = 13;
// NBX rounds alternate their count tag (cpp/migrate.cpp)
constexpr int kMigrateCountOdd = 14;
// the counts to and from given peers, by persistent requests (MigratePeers)
constexpr int kMigratePeers = 15;
// pyshard.unstructured's messages (cpp/index_exchange.cpp): the setup's row lists, the
// gather's rows and the scatter's values, each its own.
constexpr int kIndexSetup = 16;
constexpr int kIndex = 17;
constexpr int kIndexReverse = 18;
// The node-local transport's messages to peers on other nodes (ShmExchangeStep).
constexpr int kShmOffNode = 7301;

}  // namespace pyshard::tags
