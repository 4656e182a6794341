# Ashlar's wire and disk formats. Every message between nodes and every checkpoint
# record is one of these structs. Tensors are raw little-endian IEEE-754 float32 bytes
# in Data fields; receivers check each length against what they expect before use.
@0xe012c284ee1ff836;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("ashlar::schema");

# ---- Membership -------------------------------------------------------------------

enum Role {
  scheduler @0;
  server @1;
  worker @2;
  profiler @3;
}

# First message of every node to the scheduler.
struct Hello {
  protocolVersion @0 :UInt32;
  token @1 :Text;          # cluster token (shared secret), compared as bytes
  role @2 :Role;
  node @3 :Text;           # host:port or a name the node gives itself
}

# A worker asks to take part in training.
struct RegisterWorker {
  requestedId @0 :UInt32;  # 0xFFFFFFFF = let the scheduler choose
  host @1 :Text;
  backend @2 :Text;        # "cpu", "cuda:0", ...
}

struct ShardRange {
  shardId @0 :UInt32;
  begin @1 :UInt64;
  end @2 :UInt64;
}

# The scheduler's answer: what this worker trains on and how.
struct Assignment {
  workerId @0 :UInt32;
  shards @1 :List(ShardRange);
  layerWidths @2 :List(UInt32);  # the MLP, input to output
  batchSize @3 :UInt32;          # this worker's batch share, samples
  dataBegin @4 :UInt64;          # this worker's part of the training set: [begin, begin+count)
  dataCount @5 :UInt64;
  steps @6 :UInt64;              # steps to run before it is done
  seed @7 :UInt64;
  policy @8 :Text;
}

struct MembershipChange {
  enum Kind {
    join @0;
    leave @1;
    fail @2;
  }
  kind @0 :Kind;
  workerId @1 :UInt32;
  reason @2 :Text;
}

# ---- Parameters ---------------------------------------------------------------------

struct PullRequest {
  workerId @0 :UInt32;
  shardId @1 :UInt32;
  snapshot @2 :Bool;       # read now, outside the sync policy (evaluation, status)
}

struct PullReply {
  shardId @0 :UInt32;
  version @1 :UInt64;
  begin @2 :UInt64;        # first parameter index of this shard's range
  params @3 :Data;         # float32 LE, (end - begin) values
  waitNs @4 :UInt64;       # how long the shard held the read back for the policy
}

struct Push {
  workerId @0 :UInt32;
  shardId @1 :UInt32;
  baseVersion @2 :UInt64;  # the shard version the gradient was computed from
  batchSize @3 :UInt32;    # samples behind this mean gradient
  grad @4 :Data;           # float32 LE, the shard's range length
}

struct PushAck {
  shardId @0 :UInt32;
  version @1 :UInt64;      # the shard's version after handling the push
  outcome @2 :Outcome;
  staleness @3 :UInt64;
  enum Outcome {
    applied @0;
    buffered @1;
    dropped @2;
  }
}

struct ShardStatus {
  shardId @0 :UInt32;
  version @1 :UInt64;
  begin @2 :UInt64;
  end @3 :UInt64;
  pushes @4 :UInt64;
  applied @5 :UInt64;
  dropped @6 :UInt64;
  stalenessSum @7 :UInt64;
  stalenessMax @8 :UInt64;
  liveWorkers @9 :List(UInt32);
  pendingReads @10 :UInt32;
}

# ---- Profiling and stages -------------------------------------------------------------

struct ProfileReport {
  workerId @0 :UInt32;
  step @1 :UInt64;
  samples @2 :UInt32;
  loss @3 :Float64;        # mean loss over the step's batch
  computeNs @4 :UInt64;
  pullNs @5 :UInt64;       # pull time less the time held by the policy
  pushNs @6 :UInt64;
  waitNs @7 :UInt64;       # time held by the policy
}

struct WorkerStats {
  workerId @0 :UInt32;
  steps @1 :UInt64;
  samples @2 :UInt64;
  samplesPerSecond @3 :Float64;   # smoothed
  stepSeconds @4 :Float64;        # smoothed
  computeSeconds @5 :Float64;     # smoothed
  waitSeconds @6 :Float64;        # smoothed
  loss @7 :Float64;               # smoothed
  done @8 :Bool;
  totalComputeSeconds @9 :Float64;
  totalWaitSeconds @10 :Float64;
}

struct ClusterStats {
  workers @0 :List(WorkerStats);
  totalSamples @1 :UInt64;
  elapsedSeconds @2 :Float64;
  loss @3 :Float64;
}

enum Stage {
  profiling @0;
  ahl @1;
  shl @2;
  done @3;
}

struct StageChange {
  stage @0 :Stage;
  version @1 :UInt64;
  reason @2 :Text;
}

# ---- Disk ---------------------------------------------------------------------------------

struct CheckpointRecord {
  shardId @0 :UInt32;
  version @1 :UInt64;
  begin @2 :UInt64;
  params @3 :Data;         # float32 LE
  velocity @4 :Data;       # optimizer momentum, float32 LE
  checksum @5 :UInt64;     # over params and velocity
  unixNs @6 :Int64;
}
