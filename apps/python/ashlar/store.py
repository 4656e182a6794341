"""The worker scripts' small collectives (ashlar.torch's broadcast, allreduce, allgather),
through a directory only they can read.

`ashlar launch --python` gives its scripts a store in its private directory (mode 0700,
ASHLAR_STORE_DIR): each collective is a file per rank, written aside and renamed into place
(a reader sees it whole or not at all). Every rank takes part in every collective in the
same order (as with Horovod and torch.distributed); a rank whose process has ended is
marked by the launcher (`left-RANK`) and is no longer waited for, so a lost worker does not
hang the others' metrics. These carry metrics, initial parameters and optimizer state;
the training itself goes through Ashlar's shards and policies.

Without a store (one process, started by hand) there is one rank and every collective is
that rank's own value.
"""
import os
import pickle
import time

__all__ = ["Store", "CollectiveError"]


class CollectiveError(RuntimeError):
    """A collective could not complete: a rank did not take part within the timeout."""


class Store:
    def __init__(self, path, rank, size, timeout=None):
        self.path = path
        self.rank = rank
        self.size = size
        # Seconds a collective waits for a rank that neither took part nor ended. Default:
        # 600 (ASHLAR_COLLECTIVE_TIMEOUT): a rank still loading its data is not lost.
        self.timeout = float(timeout if timeout is not None else os.environ.get("ASHLAR_COLLECTIVE_TIMEOUT", 600))
        self._seq = 0
        # Called while a collective waits (ashlar.torch's optimizer: a worker waiting for its
        # peers keeps its Ashlar worker stepping, so that a policy bounding how far workers
        # may drift apart does not hold the peers it waits for).
        self.idle = None

    # --- files -----------------------------------------------------------------------
    def _file(self, key, rank):
        return os.path.join(self.path, f"{key}.{rank}")

    def put(self, name, data):
        """Writes `data` (bytes) as `name`, whole: aside, then renamed into place."""
        final = os.path.join(self.path, name)
        tmp = final + f".tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final)

    def left(self, rank):
        return os.path.exists(os.path.join(self.path, f"left-{rank}"))

    def _wait(self, key, rank, what):
        f = self._file(key, rank)
        start = time.monotonic()
        pause = 0.001
        while True:
            try:
                with open(f, "rb") as fh:
                    return fh.read()
            except FileNotFoundError:
                pass
            if self.left(rank):
                return None
            if time.monotonic() - start > self.timeout:
                raise CollectiveError(f"ashlar.torch.{what}: rank {rank} did not take part in collective {key} within "
                                      f"{self.timeout:.0f} s (ASHLAR_COLLECTIVE_TIMEOUT); every rank must call the "
                                      "same collectives in the same order")
            if self.idle is not None:
                self.idle()
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    # --- collectives -----------------------------------------------------------------
    def exchange(self, obj, what, root=None):
        """Every rank's `obj` (a dict rank -> obj, ranks that ended left out); with `root`,
        only the root's is written and read (the others take part with an empty mark).
        A rank's file of the collective before this one is removed here: every rank has
        written this one, so none reads that one any more."""
        if self.size == 1:
            return {self.rank: obj}
        key = f"c{self._seq}"
        self._seq += 1
        mine = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if root is None or root == self.rank else b""
        self.put(f"{key}.{self.rank}", mine)
        out = {}
        ranks = range(self.size) if root is None else [root]
        for r in ranks:
            if r == self.rank:
                out[r] = obj
                continue
            data = self._wait(key, r, what)
            if data is None:
                continue
            out[r] = pickle.loads(data)
        if root is not None and root != self.rank and root not in out:
            raise CollectiveError(f"ashlar.torch.{what}: the root rank {root} has ended")
        if root is not None:  # everyone's mark: the collective is complete for every rank
            for r in range(self.size):
                if r != self.rank and r != root:
                    self._wait(key, r, what)
        if self._seq >= 2:
            try:
                os.remove(self._file(f"c{self._seq - 2}", self.rank))
            except FileNotFoundError:
                pass
        return out
