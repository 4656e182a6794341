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
  token @1 :Text;          # unused: the connection's handshake proves the token, which never crosses the wire
  roles @2 :List(Role);
  node @3 :Text;           # host:pid or a name the node gives itself
  slots @4 :UInt32;        # workers this node may host
  replaceShard @5 :Int64 = -1; # >= 0: host this shard of the running job again (restored from its checkpoints)
}

# The scheduler's answer to an accepted Hello.
struct Welcome {
  nodeId @0 :UInt32;       # the number the scheduler gives this node
  cluster @1 :Text;        # the scheduler's address, for logs
}

# Scheduler -> server node: host shard `range` with these initial values.
struct SpawnShard {
  range @0 :ShardRange;
  params @1 :Data;         # float32 LE, range length
  policy @2 :Text;
  lr @3 :Float32;
  momentum @4 :Float32;
  weightDecay @5 :Float32;
  stalenessAwareLr @6 :Bool;
  stalenessBound @7 :UInt64;   # ssp
  k @8 :UInt32;                # ksync / kasync
  dataKey @9 :Text;            # data-plane key of this job; empty: pulls and pushes over CAF only
  checkpointDir @10 :Text;     # checkpoint into DIR/shard-ID on the node (the node's own
                               # --checkpoint-dir wins); empty: none
  checkpointEvery @11 :UInt64; # unused: the job driver paces checkpoint cuts
  checkpointKeep @12 :UInt32;
  resume @13 :Bool;            # restore the newest intact checkpoint before serving
  averageSamples @14 :Float64; # > 0: keep a running average of the parameters, this half-life
                               # in samples (train.average_epochs); 0: none
  job @15 :Text;               # the job's id, random per job: a node asked again for a shard it
                               # serves for the same job answers with it; empty: unknown
  optimizer @16 :Text;         # the update rule: sgd (empty: sgd), adam, adamw
  beta1 @17 :Float32;          # adam, adamw: the moments' decay rates and the denominator's term
  beta2 @18 :Float32;
  eps @19 :Float32;
}

# Scheduler -> worker node: start a worker that loads its own copy of the data.
struct SpawnWorker {
  requestedId @0 :UInt32;
  dataDir @1 :Text;
  dataSource @2 :Text;
  trainLimit @3 :UInt64;
  seed @4 :UInt64;
  inputWidth @5 :UInt32;       # model.input's size (the flat width)
  classes @6 :UInt32;
  inputShape @7 :List(UInt32);  # model.input: C, H, W
  cropPadding @8 :UInt32;       # data.crop_padding
  hflip @9 :Bool;               # data.hflip
  ringKey @10 :Text;            # a ring job's data-plane key: the node takes its workers' ring chunks under it ("": CAF)
}

# A job submitted to a running scheduler: configuration keys and values, as text.
struct JobRequest {
  settings @0 :List(Setting);
  struct Setting {
    key @0 :Text;
    value @1 :Text;
  }
}

struct JobResult {
  reportJson @0 :Text;
}

# Control requests from `ashlar ctl`.
struct CtlRequest {
  enum Op {
    removeWorker @0;
    addWorker @1;
    shutdown @2;
    stopJob @3;            # stop the running or waiting job; the cluster stays
  }
  op @0 :Op;
  workerId @1 :UInt32;
  count @2 :UInt32;
}

struct NodeInfo {
  nodeId @0 :UInt32;
  name @1 :Text;
  roles @2 :List(Role);
  slots @3 :UInt32;        # workers this node may host
  alive @4 :Bool;
}

# `ashlar status`: members, their roles and addresses, speeds, versions, stage.
struct ClusterStatus {
  nodes @0 :List(NodeInfo);
  stats @1 :ClusterStats;
  shards @2 :List(ShardStatus);
  stage @3 :Text;
  job @4 :Text;            # a one-line description of the running job, empty when idle
  jobSamples @5 :UInt64;   # the samples the running job trains in all (0: none runs)
  trainSamples @6 :UInt64; # its training set's
}

# A worker asks to take part in training.
struct RegisterWorker {
  requestedId @0 :UInt32;  # 0xFFFFFFFF = let the scheduler choose
  host @1 :Text;
  backend @2 :Text;        # "cpu", "cuda:0", ...
  ringEndpoint @3 :Text;   # "host:port" of the data plane that takes its ring chunks ("": CAF only)
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
  layerWidths @2 :List(UInt32);  # unused since modelInput (was: the MLP, input to output)
  batchSize @3 :UInt32;          # this worker's batch share, samples
  dataBegin @4 :UInt64;          # this worker's part of the training set: [begin, begin+count)
  dataCount @5 :UInt64;
  steps @6 :UInt64;              # steps to run before it is done
  seed @7 :UInt64;
  policy @8 :Text;
  chunkFloats @9 :UInt64;      # largest tensor chunk per message
  chunksInFlight @10 :UInt32;  # chunk requests a worker keeps outstanding per shard
  paceNsPerSample @11 :UInt64; # emulated speed: wall time per sample; 0 = unpaced
  contention @12 :List(Slowdown);  # this worker's slowdown intervals, seconds after it starts
  dataEndpoints @13 :List(Text);   # per shard: HOST:PORT of its data plane, or empty (CAF only)
  dataKey @14 :Text;               # presented to the shards' data planes
  localSteps @15 :UInt32;          # steps between commits (ADSP, ASHL); 0 or 1: push every step
  localLr @16 :Float32;            # learning rate of the local steps
  commitScale @17 :Float32;        # a commit pushes its summed gradients times this (1/workers: model averaging)
  topkRatio @18 :Float32;          # pushes carry this fraction of each range (top-k, error feedback); 0: dense
  momentum @19 :Float32;           # ring mode: the workers' own optimizer (lr is localLr)
  weightDecay @20 :Float32;
  shardWaitS @21 :Float64;         # a lost shard may be replaced within this long (0: fail at once)
  cursorEpoch @22 :UInt64;         # a resumed worker's data position: passes over its part done
  cursorPos @23 :UInt64;           # and samples into the current pass
  pullTopkRatio @24 :Float32;      # pulls are delta reads of this fraction of each range; 0: dense
  overlapCommits @25 :Bool;        # local steps: a commit's push and pull run behind the next local steps
  modelInput @26 :List(UInt32);    # the model (runtime/model/model.hpp): input C, H, W
  modelClasses @27 :UInt32;
  modelHidden @28 :List(UInt32);   # the MLP short form, when modelLayers is empty
  modelLayers @29 :Text;           # the layers' text form; empty: the MLP of modelHidden
  localMomentum @30 :Float32;      # commits (ADSP, ASHL): the worker's momentum over its own gradients; 0: none
  optimizer @31 :Text;             # ring mode: the workers' update rule, sgd (empty: sgd), adam, adamw
  beta1 @32 :Float32;              # ring mode, adam and adamw: as SpawnShard's
  beta2 @33 :Float32;
  eps @34 :Float32;
  struct Slowdown {
    startS @0 :Float64;
    endS @1 :Float64;
    factor @2 :Float64;
  }
}

struct MembershipChange {
  enum Kind {
    join @0;
    leave @1;
    fail @2;
    error @3;              # the worker's own computation failed (its script raised): the job fails
  }
  kind @0 :Kind;
  workerId @1 :UInt32;
  reason @2 :Text;
  early @3 :Bool;          # a leave before the worker's steps were done (removed on request)
  steps @4 :UInt64;        # a leave: the steps the worker trained
}

# ---- Parameters ---------------------------------------------------------------------

struct PullRequest {
  workerId @0 :UInt32;
  shardId @1 :UInt32;
  snapshot @2 :Bool;       # read now, outside the sync policy (evaluation, status)
  offset @3 :UInt64;       # first parameter of the chunk wanted, relative to the range
  maxFloats @4 :UInt64;    # chunk size limit; 0 = the whole range in one message
  readId @5 :UInt64;       # 0 starts a read; later chunks name the read the first reply began
  topkRatio @6 :Float32;   # > 0: a delta read of this fraction of the range (pull compression)
  viewSeq @7 :UInt64;      # the last delta or dense read the worker applied (0: none)
  average @8 :Bool;        # with snapshot: the shard's running average of its parameters
                           # where it keeps one (train.average_epochs), its parameters otherwise
}

struct PullReply {
  shardId @0 :UInt32;
  version @1 :UInt64;
  begin @2 :UInt64;        # first parameter index of this shard's range
  params @3 :Data;         # float32 LE, (end - begin) values
  waitNs @4 :UInt64;       # how long the shard held the read back for the policy
  offset @5 :UInt64;       # where `params` starts within the range
  total @6 :UInt64;        # the range's length; more chunks follow while offset+len < total
  readId @7 :UInt64;       # names this read's frozen copy for the following chunk requests
  sparse @8 :Bool;         # a delta read: params holds only the entries at `index` (whole, offset 0)
  index @9 :Data;          # sparse: uint32 LE, ascending, positions within the range
  viewSeq @10 :UInt64;     # the worker's view after this reply (0: the shard keeps none)
}

struct Push {
  workerId @0 :UInt32;
  shardId @1 :UInt32;
  baseVersion @2 :UInt64;  # the shard version the gradient was computed from
  batchSize @3 :UInt32;    # samples behind this mean gradient
  grad @4 :Data;           # float32 LE: a chunk of the range's gradient
  offset @5 :UInt64;       # where the chunk starts within the range
  total @6 :UInt64;        # the range's length: the push is complete when all of it arrived
  sparse @7 :Bool;         # grad holds only the entries at `index` (a whole push, offset 0)
  index @8 :Data;          # sparse: uint32 LE, ascending, positions within the range
  readFollows @9 :Bool;    # the worker's next read follows: answered with (after) that read's reply
}

# Ring all-reduce (decentralized mode): one step's chunk from a worker to the next on the ring.
struct RingChunk {
  round @0 :UInt64;   # the training step the all-reduce belongs to
  step @1 :UInt32;    # the all-reduce step: reduce-scatter, then all-gather
  chunk @2 :UInt32;   # which of the ring's chunks
  data @3 :Data;      # float32 LE
  ring @4 :UInt32;    # the ring's generation: a ring re-formed after a member's loss is a new one
  sync @5 :UInt8;     # 0: a step's gradients; 1, 2: a re-formed ring's agreement on its state
}

struct PushAck {
  shardId @0 :UInt32;
  version @1 :UInt64;      # the shard's version after handling the push
  outcome @2 :Outcome;
  staleness @3 :UInt64;
  complete @4 :Bool;       # false: a chunk was stored, the push is not whole yet
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
  cut @11 :UInt64;          # the newest checkpoint cut on disk (0: none)
  cutError @12 :Text;       # why the last checkpoint write failed, or ""
  samples @13 :UInt64;      # the samples of the gradients that went into updates
  holdingUp @14 :List(UInt32); # the live workers a held read waits for (the policy's holding_up)
  heldSeconds @15 :Float64;  # how long the oldest held read has waited
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
  bytes @8 :UInt64;        # tensor bytes pulled and pushed in this step
  stageChanges @9 :UInt32; # behaviour changes (stage switches) of the worker so far
  startNs @10 :UInt64;     # when the step began: wall-clock ns since the Unix epoch
  computeOffsetNs @11 :UInt64; # the computation began this long after startNs
  staleness @12 :UInt64;   # the largest staleness the shards reported for this step's push
  batch @13 :UInt32;       # the batch share in force
  position @14 :DataPosition; # where the worker's data cursor stands after this step
  denseBytes @15 :UInt64;  # what the step's pulls and pushes would have moved uncompressed
  stepsTarget @16 :UInt64; # the steps the worker trains in all, as it counts them now
  directives @17 :UInt32;  # batch directives it has taken from the scheduler
  metrics @18 :List(NamedValue); # named metrics the script reported with this step
}

# A named figure of a script's evaluation ("val_ppl", "accuracy").
struct NamedValue {
  name @0 :Text;
  value @1 :Float64;
}

# The seq-th report of named metrics of the job, by a worker, at `samples` trained.
struct MetricReport {
  seq @0 :UInt64;
  workerId @1 :UInt32;
  samples @2 :UInt64;
  seconds @3 :Float64;
  values @4 :List(NamedValue);
}

# A worker's place in its part of the training set: the part, the cursor's shuffle seed,
# passes over the part done and samples into the current pass.
struct DataPosition {
  begin @0 :UInt64;
  count @1 :UInt64;
  seed @2 :UInt64;
  epoch @3 :UInt64;
  pos @4 :UInt64;
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
  bytes @11 :UInt64;              # tensor bytes pulled and pushed
  computePerSample @12 :Float64;  # smoothed compute seconds per sample (waits excluded)
  stageChanges @13 :UInt32;       # behaviour changes (stage switches) of the worker
  staleness @14 :Float64;         # smoothed staleness of the worker's pushes
  predictedSpeed @15 :Float64;    # compute samples/s the profiler's GRU predicts next
  observedSpeed @16 :Float64;     # compute samples/s over the last window
  predictionError @17 :Float64;   # mean |predicted - observed| / observed so far
  batch @18 :UInt32;              # the batch share in force
  position @19 :DataPosition;     # the data cursor, as of the last report
  denseBytes @20 :UInt64;         # what the pulls and pushes would have moved uncompressed
  stepsTarget @21 :UInt64;        # the steps it trains in all, as of the last report
  directives @22 :UInt32;         # batch directives it had taken then
}

struct ClusterStats {
  workers @0 :List(WorkerStats);
  totalSamples @1 :UInt64;
  elapsedSeconds @2 :Float64;
  loss @3 :Float64;
  metricReports @4 :List(MetricReport); # the latest reports of named metrics, oldest first
  refusedReports @5 :UInt64; # step reports the profiler refused (not a member, more samples than a step holds, replayed)
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
  checksum @5 :UInt64;     # CRC-32 over shardId, version, begin, end, cut (unless 0), params, velocity, and averageSamples and average where present
  unixNs @6 :Int64;
  end @7 :UInt64;
  cut @8 :UInt64;          # the job's checkpoint cut this record belongs to (0: a shard's own stop record)
  average @9 :Data;        # the running average of the parameters (train.average_epochs), float32 LE, or empty
  averageSamples @10 :UInt64; # the samples the average has taken in since it (re)started
  format @11 :UInt32;      # the record format a reader must know to restore it (0: written before formats were stamped, read as 1)
}

# What the scheduler keeps to resume a job: the settings it ran with (to refuse a
# configuration that differs), and how far it got.
struct JobRecord {
  settings @0 :List(Text);  # "key=value", every key that shapes training
  samples @1 :UInt64;       # samples trained so far
  seconds @2 :Float64;      # training time so far
  unixNs @3 :Int64;
  resumes @4 :UInt32;       # times this job was resumed
  stage @5 :Text;           # the training stage in force (ASHL: "ahl", "shl"), or ""
  workers @6 :List(WorkerRecord); # the members, their batch shares and data positions
  cut @7 :UInt64;           # the checkpoint cut every shard wrote for this record
  format @8 :UInt32;        # the record format a reader must know to resume from it (0: written before formats were stamped, read as 1)
  struct WorkerRecord {
    workerId @0 :UInt32;
    batch @1 :UInt32;
    position @2 :DataPosition;
    samples @3 :UInt64;
  }
}
