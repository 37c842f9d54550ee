"""Ray backend: resource pools over placement groups, workers as (named) Ray actors."""

from __future__ import annotations

import os
import uuid
import weakref

import psutil
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import rendezvous
from hybridflow.single_controller.base.colocated import build_colocated_class
from hybridflow.single_controller.base.direct import HandleKind
from hybridflow.single_controller.base.errors import WorkerDiedError, WorkerError
from hybridflow.single_controller.base.heartbeat import clear_progress, read_progress
from hybridflow.single_controller.base.watchdog import build_hang_error, wait_with_deadline
from hybridflow.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup, rows_per_rank
from hybridflow.single_controller.ray import health
from hybridflow.single_controller.ray.helpers import RayHelpers
from hybridflow.single_controller.ray.placement import alive_nodes, place_one_group_per_node

PLACEMENT_TIMEOUT_S = float(os.environ.get("HYBRIDFLOW_PLACEMENT_TIMEOUT_S", 60))


class RayResourcePool(ResourcePool):
    """``process_on_nodes=[n0, n1, ...]``: one placement group per node with one bundle per process.

    Up to ``max_colocate_count`` worker groups (veRL's default: 10) may place their workers on the
    pool; each worker takes ``1 / max_colocate_count`` of its bundle's CPU (and GPU). One more group
    fails at once, saying so, instead of waiting forever for a share that cannot free up.
    """

    def __init__(
        self,
        process_on_nodes=None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: str | None = None,
    ):
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or f"hf_pool_{uuid.uuid4().hex[:6]}"
        self.detached = detached
        self.accelerator_type = accelerator_type
        self.pgs = None
        self._groups: weakref.WeakSet = weakref.WeakSet()  # the worker groups holding a share of the bundles

    def reserve_share(self, group) -> None:
        """Take one of the ``max_colocate_count`` shares for ``group``'s workers, or fail at once."""
        if len(self._groups) >= self.max_colocate_count:
            holders = ", ".join(sorted(repr(g.name) for g in self._groups))
            raise RuntimeError(
                f"resource pool {self.name_prefix!r} has no room for worker group {group.name!r}: it takes at most "
                f"max_colocate_count={self.max_colocate_count} worker group(s) and holds {len(self._groups)} "
                f"({holders}). Shut one down, use another pool, raise max_colocate_count, or fuse the roles into "
                "one worker class (create_colocated_worker_cls)."
            )
        self._groups.add(group)

    def release_share(self, group) -> None:
        self._groups.discard(group)

    def bundle(self) -> dict:
        b = {"CPU": 1}
        if self.use_gpu:
            b["GPU"] = 1
        return b

    def _check_capacity(self):
        nodes = len(alive_nodes())
        if len(self.store) > nodes:
            raise RuntimeError(
                f"resource pool {self.name_prefix!r} spans {len(self.store)} nodes (process_on_nodes={self.store}, "
                f"one node per entry) but the Ray cluster has {nodes} alive node(s). Lower trainer.nnodes or add "
                "nodes to the cluster (ray start --address=<head> on each)."
            )
        need = {k: v * self.world_size for k, v in self.bundle().items()}
        have = ray.cluster_resources()
        short = {k: (v, have.get(k, 0)) for k, v in need.items() if have.get(k, 0) < v}
        if short:
            detail = ", ".join(f"{k}: asked {a:g}, cluster has {h:g}" for k, (a, h) in short.items())
            raise RuntimeError(
                f"resource pool {self.name_prefix!r} asks for {self.world_size} worker(s) "
                f"(process_on_nodes={self.store}, one {self.bundle()} bundle each) but the Ray cluster is too small "
                f"({detail}). "
                "Lower trainer.nnodes / trainer.n_gpus_per_node or start Ray with more resources."
            )

    def get_placement_groups(self):
        if self.pgs is not None:
            return self.pgs
        self._check_capacity()
        lifetime = "detached" if self.detached else None
        try:
            pgs = place_one_group_per_node(
                [[self.bundle()] * n for n in self.store], self.name_prefix, lifetime, PLACEMENT_TIMEOUT_S
            )
        except GetTimeoutError:
            raise RuntimeError(
                f"resource pool {self.name_prefix!r} could not place {self.store} processes with {self.bundle()} each "
                f"(one node per entry) within {PLACEMENT_TIMEOUT_S:.0f}s: the cluster has {ray.cluster_resources()} in "
                f"total and {ray.available_resources()} free on {len(alive_nodes())} node(s) (another job may hold "
                "them; each node must fit its share)."
            ) from None
        self.pgs = pgs
        return pgs

    def release(self):
        for pg in self.pgs or []:
            remove_placement_group(pg)
        self.pgs = None


class RayClassWithInitArgs(ClassWithInitArgs):
    """``RayClassWithInitArgs(cls=ray.remote(MyWorker), *args, **kwargs)``."""

    def __init__(self, cls, *args, **kwargs):
        super().__init__(cls, *args, **kwargs)
        self._options: dict = {}
        self._additional_resource: dict = {}

    def update_options(self, options: dict):
        self._options.update(options)

    def set_additional_resource(self, resources: dict):
        self._additional_resource = resources

    def remote_cls(self):
        return self.cls if hasattr(self.cls, "__ray_actor_class__") else ray.remote(self.cls)

    def create_actor(
        self, pg, bundle_index: int, env_vars: dict, name: str, num_cpus: float, num_gpus: float, detached: bool
    ):
        options = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=bundle_index
            ),
            "runtime_env": {"env_vars": env_vars},
            "name": name,
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
        }
        if self._additional_resource:
            options["resources"] = dict(self._additional_resource)
        if detached:
            options["lifetime"] = "detached"
        user = dict(self._options)
        user_env = dict(user.pop("runtime_env", None) or {})
        options.update(user)
        # a runtime_env given through update_options keeps its other fields and env vars; the
        # group's own variables (rank, rendezvous, worker_env) win
        options["runtime_env"] = {**user_env, "env_vars": {**(user_env.get("env_vars") or {}), **env_vars}}
        return self.remote_cls().options(**options).remote(*self.args, **self.kwargs)


# The variables every worker gets from its group; worker_env may not override them (veRL refuses too).
PROTECTED_WORKER_ENV = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "WG_PREFIX",
        "WG_BACKEND",
        "RAY_LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        rendezvous.ID_ENV,
    }
)


def _check_worker_env(worker_env) -> dict[str, str]:
    if not worker_env:
        return {}
    worker_env = dict(worker_env)
    clash = sorted(PROTECTED_WORKER_ENV & set(worker_env))
    if clash:
        raise ValueError(
            f"worker_env may not override the variables the worker group sets itself: {clash} "
            "(rank, world size and rendezvous address come from the resource pool)"
        )
    return {str(k): str(v) for k, v in worker_env.items()}


class RayWorkerGroup(WorkerGroup):
    """Driver-side handle over Ray actors, one per bundle of the resource pool.

    ``worker_env={"NAME": "value"}`` adds environment variables to every worker (the group's own
    RANK / WORLD_SIZE / MASTER_ADDR / ... cannot be overridden).
    """

    owns_resource_pool = False  # set by the factory, which builds one pool per group

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        worker_env: dict | None = None,
        **kwargs,
    ):
        name_prefix = name_prefix or f"hf_wg_{uuid.uuid4().hex[:6]}"
        if not isinstance(ray_cls_with_init, ClassWithInitArgs):
            raise TypeError("ray_cls_with_init must be a RayClassWithInitArgs")
        if not isinstance(ray_cls_with_init, RayClassWithInitArgs):
            ray_cls_with_init = _as_ray_cls(ray_cls_with_init)
        self._worker_env = _check_worker_env(worker_env)
        self._unfinished: list = []  # the live ranks' refs of the last call that failed (settle_unfinished)
        if worker_names is not None:  # attach to existing detached actors
            super().__init__(name_prefix, len(worker_names))
            self._workers = [ray.get_actor(n) for n in worker_names]
            self._worker_names = list(worker_names)
            self._locations = self._get(
                [w.__ray_call__.remote(health.locate) for w in self._workers], "__init__", list(range(self.world_size))
            )
        else:
            super().__init__(name_prefix, resource_pool.world_size)
            self._create_workers(resource_pool, ray_cls_with_init, detached)
            # pid and node of every rank, read once all ranks are built: lets a failure be pinned on a
            # killed process at once, before Ray's own death notice arrives, and the watchdog take
            # stacks from outside the processes (this also installs the stack-dump handler)
            self._locations = self._get(
                [w.__ray_call__.remote(health.locate) for w in self._workers], "__init__", list(range(self.world_size))
            )
        self.resource_pool = resource_pool
        self.ray_cls_with_init = ray_cls_with_init
        self._user_cls = ray_cls_with_init.user_cls
        self._bound_names = self._bind_worker_methods(self._user_cls)

    def _create_workers(self, pool: RayResourcePool, cls: RayClassWithInitArgs, detached: bool):
        pool.reserve_share(self)
        try:
            self._place_workers(pool, cls, detached)
        except BaseException:
            pool.release_share(self)
            raise

    def _place_workers(self, pool: RayResourcePool, cls: RayClassWithInitArgs, detached: bool):
        pgs = pool.get_placement_groups()
        frac = 1.0 / pool.max_colocate_count
        self._workers, self._worker_names = [], []
        # Rank 0's node address is known before any worker starts; rank 0 binds its store when it starts and
        # publishes the port (base/rendezvous.py), so workers can join torch.distributed inside __init__.
        master_addr = _rank0_node_address(pgs[0])
        self._rendezvous_id = f"{self.name}:{uuid.uuid4().hex}"  # rank 0 publishes its store's port under it
        rank = 0
        for _node, (pg, n_local) in enumerate(zip(pgs, pool.store)):
            for local_rank in range(n_local):
                env = {
                    **self._worker_env,
                    "RANK": str(rank),
                    "WORLD_SIZE": str(pool.world_size),
                    "LOCAL_RANK": str(local_rank),
                    "LOCAL_WORLD_SIZE": str(n_local),
                    "WG_PREFIX": self.name,
                    "WG_BACKEND": "ray",
                    "RAY_LOCAL_WORLD_SIZE": str(n_local),
                    "MASTER_ADDR": master_addr,
                    rendezvous.ID_ENV: self._rendezvous_id,
                }
                name = f"{self.name}_{rank}"
                self._workers.append(
                    cls.create_actor(pg, local_rank, env, name, frac, frac if pool.use_gpu else 0, detached)
                )
                self._worker_names.append(name)
                rank += 1

    @property
    def workers(self):
        return self._workers

    @property
    def worker_names(self):
        return self._worker_names

    @classmethod
    def from_detached(cls, name_prefix: str, worker_names: list[str], ray_cls_with_init: RayClassWithInitArgs):
        return cls(ray_cls_with_init=ray_cls_with_init, name_prefix=name_prefix, worker_names=worker_names)

    # --- execution -----------------------------------------------------------------------------------
    def _execute(self, method, ranks, per_rank_args, per_rank_kwargs):
        # A DataProto sent to several ranks (mesh dispatch, broadcast) is put in the object store once.
        # One sent to a single rank (a DP chunk) goes as a plain argument: an explicit ray.put costs
        # ~0.5 ms even for a tiny chunk, and Ray stores large arguments by itself anyway.
        seen: dict[int, int] = {}
        for args, kwargs in zip(per_rank_args, per_rank_kwargs):
            for v in (*args, *kwargs.values()):
                if isinstance(v, DataProto):
                    seen[id(v)] = seen.get(id(v), 0) + 1
        shared: dict[int, ray.ObjectRef] = {}

        def once(v):
            if isinstance(v, DataProto) and seen[id(v)] > 1:
                if id(v) not in shared:
                    shared[id(v)] = ray.put(v)
                return shared[id(v)]
            return v

        return _Handles(
            [
                getattr(self._workers[r], method).remote(
                    *[once(a) for a in args], **{k: once(v) for k, v in kwargs.items()}
                )
                for r, args, kwargs in zip(ranks, per_rank_args, per_rank_kwargs)
            ],
            rows_per_rank(per_rank_args, per_rank_kwargs),
        )

    def _resolve(self, method, ranks, handles):
        return self._get(handles, method, ranks)

    def _get(self, handles, method, ranks):
        """Wait for all ranks, failing as soon as any rank fails (its peers may be stuck in a collective),
        and at the watchdog's deadline when no rank answers or reports progress in time."""
        deadline = self._deadline(getattr(handles, "rows", 0))
        index = {ref: i for i, ref in enumerate(handles)}
        results: list = [None] * len(handles)
        pending = list(handles)
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=self.watchdog.poll_s)
            if not ready:
                if deadline is not None and deadline.expired():
                    raise build_hang_error(method, deadline, self, sorted(ranks[index[r]] for r in pending)) from None
                continue
            try:
                values = ray.get(ready)
            except (RayActorError, RayTaskError):
                errors = []
                for ref in ready:
                    try:
                        self._get_one(ref, method, ranks[index[ref]])
                    except WorkerError as err:
                        errors.append(err)
                died = [e for e in errors if isinstance(e, WorkerDiedError)]
                error = died[0] if died else self._dead_peer_or(errors[0], pending, index, method, ranks)
                self._unfinished = list(pending)  # the ranks still running it (settle_unfinished)
                raise self._with_lost_nodes(error) from None
            for ref, value in zip(ready, values):
                results[index[ref]] = value
        return results

    def settle_unfinished(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the ranks still running the last call that failed on another rank
        (``_get`` fails as soon as one rank does). A cleanup call (stopping a vLLM engine) then finishes on
        the live ranks before the group is killed; killed halfway, the engine's processes lost their
        parent and its resource tracker mid-shutdown. Returns whether they all ended."""
        unfinished, self._unfinished = self._unfinished, []
        if not unfinished:
            return True
        _, pending = ray.wait(unfinished, num_returns=len(unfinished), timeout=timeout_s)
        return not pending

    def _dead_peer_or(self, err, pending, index, method, ranks, wait_s: float = 8.0):
        """When a rank dies, its peers fail too (a broken collective) and may answer first: name
        the dead rank, the cause, rather than a survivor's symptom."""
        procs = getattr(self, "_locations", None) or []
        for rank in ranks:
            if rank != err.rank and rank < len(procs) and not _process_alive(procs[rank].pid, procs[rank].node_id):
                died = WorkerDiedError(
                    self.name, method, rank, f"the process of rank {rank} is gone (killed or exited)"
                )
                died.add_note(f"rank {err.rank} failed as a consequence: {str(err).splitlines()[-1][:500]}")
                return died
        if not pending:
            return err
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=wait_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError as e:
                died = WorkerDiedError(self.name, method, ranks[index[ref]], str(e))
                died.add_note(f"rank {err.rank} failed as a consequence: {str(err).splitlines()[-1][:500]}")
                return died
            except Exception:
                pass
        return err

    def _get_one(self, ref, method, rank):
        try:
            return ray.get(ref)
        except RayActorError as e:
            raise WorkerDiedError(self.name, method, rank, str(e)) from None
        except RayTaskError as e:
            raise WorkerError(self.name, method, rank, str(e), cause=e.cause) from None

    def _with_lost_nodes(self, error: WorkerError) -> WorkerError:
        """A dead worker on a node that is gone: say which node (id, address) and which ranks it held."""
        if isinstance(error, WorkerDiedError):
            # Ray says "its node has died" when it is so; the GCS may take a moment to mark the node dead
            wait_s = 10.0 if "node has died" in str(error) else 0.0
            lost = health.describe_lost_nodes(self._all_locations(), wait_s=wait_s)
            if lost:
                error.add_note(f"{lost} (worker group {self.name!r})")
                error.lost_nodes = lost
        return error

    # --- watchdog support ----------------------------------------------------------------------------
    def _all_locations(self) -> list:
        known = list(getattr(self, "_locations", None) or [])
        return [known[r] if r < len(known) else health.locate_from_gcs(w) for r, w in enumerate(self._workers)]

    def _collect_stacks(self, ranks):
        return health.collect_stacks(self._all_locations(), ranks)

    def _progress_reading(self):
        return read_progress(self._progress_key, self.world_size, use_ray=True)

    # --- direct access (see base/direct.py, base/helpers.py) ------------------------------------------
    def handles(self, kind: HandleKind, role: str | None = None) -> list:
        """One ``kind.remote`` handle per rank, on the rank's actor (``role`` inside a colocated one)."""
        return [kind.remote(actor, role, rank) for rank, actor in enumerate(self._workers)]

    def spawn_helpers(self, cls, count: int, *args, **kwargs) -> RayHelpers:
        """``count`` async Ray actors of ``cls`` beside the driver (no CPU reserved)."""
        return RayHelpers(cls, count, args, kwargs)

    def shutdown(self, reason: str = "shutdown() was called"):
        """Kill the workers; a group that owns its resource pool (the factory's) also frees the pool's
        placement groups, so a later run in the same Ray session gets the devices back. Later calls on
        the group (and its role views) raise ``WorkerGroupShutDownError`` with ``reason``."""
        self._mark_shut_down(reason)
        for w in getattr(self, "_workers", []):
            try:
                ray.kill(w)
            except Exception:
                pass
        if getattr(self, "_workers", None):
            clear_progress(self._progress_key, self.world_size, use_ray=True)
            _drop_rendezvous(getattr(self, "_rendezvous_id", None))
        self._workers = []
        pool = getattr(self, "resource_pool", None)
        if pool is not None:
            pool.release_share(self)
        if pool is not None and self.owns_resource_pool:
            pool.release()


class _Handles(list):
    """The per-rank ObjectRefs of one call, with the rows each rank got (scales the deadline)."""

    def __init__(self, refs, rows: int = 0):
        super().__init__(refs)
        self.rows = rows


def _process_alive(pid, node) -> bool:
    """False only when ``pid`` ran on this node and is gone (or a zombie); unknown means alive."""
    if pid is None or node != ray.get_runtime_context().get_node_id():
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@ray.remote(num_cpus=0)
def _node_address() -> str:
    return ray.util.get_node_ip_address()


def _rank0_node_address(pg) -> str:
    strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
    ref = _node_address.options(scheduling_strategy=strategy).remote()
    return wait_with_deadline([ref], what="finding rank 0's node address")[0]


def _drop_rendezvous(rendezvous_id: str | None) -> None:
    """The published port of a group whose rank 0 never opened its process group (rank 0 drops it otherwise)."""
    if rendezvous_id:
        from ray.experimental.internal_kv import _internal_kv_del

        try:
            _internal_kv_del(rendezvous_id.encode(), namespace=rendezvous.NAMESPACE)
        except Exception:
            pass


def _as_ray_cls(c: ClassWithInitArgs) -> RayClassWithInitArgs:
    return RayClassWithInitArgs(c.cls, *c.args, **c.kwargs)


def create_colocated_worker_cls(
    class_dict: dict[str, ClassWithInitArgs], remote_options: dict | None = None
) -> RayClassWithInitArgs:
    """Fuse several roles into one actor class (one process per device); see ``WorkerGroup.spawn``.

    ``remote_options`` go to ``ray.remote`` (e.g. ``concurrency_groups``, which only it accepts).
    """
    fused = build_colocated_class(class_dict)
    out = RayClassWithInitArgs(ray.remote(**remote_options)(fused.cls) if remote_options else ray.remote(fused.cls))
    for spec in class_dict.values():
        if isinstance(spec, RayClassWithInitArgs):
            out.update_options(spec._options)
    return out
