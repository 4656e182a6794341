"""The hand-over between Ashlar's worker threads and the script's own training loop.

Ashlar's worker calls its backend's train_step(params, x, y, grad) on a thread of its own
once per step. The Bridge is that backend: it hands the step to the script's loop
(Bridge.next_step) and blocks until the script has written the gradient and finished the
step (Step.finish). Nothing is copied on the way: the step's arrays are Ashlar's buffers.
"""
import queue
import threading


class Closed(Exception):
    """The worker ended (the job finished, the node left the cluster, or shutdown)."""


class ScriptFailed(Exception):
    """The script failed (an exception it did not catch): the worker fails with this, and
    the job with it, instead of leaving as if the script had stopped on purpose."""


class Step:
    """One step of an Ashlar worker, waiting for the script: `params` (the parameters to
    compute at, read-only), `x`, `y` (the batch), `grad` (to be filled with the mean
    gradient over the batch)."""

    def __init__(self, params, x, y, grad):
        self.params, self.x, self.y, self.grad = params, x, y, grad
        self._done = threading.Event()
        self._result = None
        self._error = None

    def finish(self, loss_sum, correct, n=None, metrics=None):
        """The gradient is in `grad`: hands the step back to Ashlar with the batch's summed
        loss and its number of correct predictions; `n`, the batch's size when the script
        took a batch of its own (its DataLoader's), not Ashlar's `y`; `metrics`, named
        figures of the script's evaluation ({"val_ppl": 141.2}) for the job's report."""
        if metrics:
            self._result = (float(loss_sum), int(correct), len(self.y) if n is None else int(n), dict(metrics))
        elif n is None:
            self._result = (float(loss_sum), int(correct))
        else:
            self._result = (float(loss_sum), int(correct), int(n))
        self._done.set()

    @property
    def abandoned(self):
        """Whether the step was handed back already (failed at shutdown): its arrays must
        not be touched."""
        return self._done.is_set()

    def fail(self, error):
        self._error = error
        self._done.set()

    def wait(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


class Bridge:
    """An Ashlar backend whose steps are taken by the script's loop."""

    def __init__(self):
        self._steps = queue.Queue()
        self._closed = threading.Event()
        self._current = None  # the step the script holds
        self.batch_size = 0
        self.evaluator = None  # evaluate(params, x, y) -> (loss_sum, correct), set by the optimizer
        self._lock = threading.Lock()
        self._workers = 0      # Ashlar workers of this process computing through the bridge
        self._started = False  # whether one ever did
        self.model = None      # the job's model (a dict: input, classes, layers) once a worker starts
        self._model_given = threading.Event()
        self._error = None     # set by close(error): what the steps fail with
        self.error_delivered = threading.Event()  # a worker's step failed with it

    # --- called by Ashlar as its workers start and end --------------------------------
    def model_given(self, model):
        self.model = dict(model)
        self._model_given.set()

    def worker_started(self):
        with self._lock:
            self._workers += 1
            self._started = True

    def worker_done(self):
        with self._lock:
            self._workers -= 1

    def finished(self):
        """Whether every worker that computed through the bridge has ended (its job done,
        or it was removed from the job)."""
        with self._lock:
            return self._started and self._workers <= 0

    # --- called by Ashlar's worker threads -------------------------------------------
    def train_step(self, params, x, y, grad):
        step = Step(params, x, y, grad)
        with self._lock:  # against close(): a step put after it drained would wait for ever
            if self._closed.is_set():
                if self._error is not None:
                    self.error_delivered.set()
                raise self._error or Closed("the script stopped taking steps (ashlar.shutdown)")
            self._steps.put(step)
        # A step the script lost (an interrupt between taking it and holding it) must not
        # keep this worker's thread: closing the bridge ends the wait.
        try:
            while not step._done.wait(0.2):
                if self._closed.is_set():
                    raise self._error or Closed("ashlar: shut down while the step waited for the script")
            return step.wait()
        except ScriptFailed:
            self.error_delivered.set()
            raise

    def evaluate(self, params, x, y):
        if self.evaluator is None:
            raise RuntimeError("no model to evaluate with yet (create a DistributedOptimizer)")
        return self.evaluator(params, x, y)

    # --- called by the script --------------------------------------------------------
    def wait_model(self, alive, timeout=None):
        """The job's model, once a worker of this process has started; None if the
        worker ended first, the bridge was closed or `timeout` seconds passed."""
        waited = 0.0
        while not self._model_given.wait(0.2):
            waited += 0.2
            if self._closed.is_set() or not alive() or (timeout is not None and waited >= timeout):
                return None
        return self.model

    def next_step(self, alive):
        """The next step of a worker of this process; raises Closed once the worker
        ended (`alive()` false) or the bridge was closed."""
        while True:
            if self._closed.is_set():
                raise Closed("ashlar: the worker has ended")
            try:
                step = self._steps.get(timeout=0.2)
            except queue.Empty:
                if not alive() or self.finished():
                    raise Closed("ashlar: the worker has ended")
                continue
            self.batch_size = len(step.y)
            self._current = step
            return step

    def close(self, error=None):
        """No more steps: a step waiting for the script, or held by it, fails (its worker
        leaves). With `error` (a ScriptFailed: the script raised), the steps fail with it
        and so does the worker, and the job with it."""
        with self._lock:
            if error is not None and not self._closed.is_set():
                self._error = error
            self._closed.set()
            current = self._current
            if current is not None and not current._done.is_set():
                current.fail(self._error or Closed("ashlar: shut down while the script held the step"))
            while True:
                try:
                    self._steps.get_nowait().fail(
                        self._error or Closed("ashlar: shut down while the step waited for the script"))
                except queue.Empty:
                    break
