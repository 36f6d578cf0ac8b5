"""The instance lifecycle: up, stop, start, down — the same for every provider.

Every step is written to the ledger before the provider is asked to do it (intent first), so a
crash at any point leaves a row that ``reconcile`` can match with what the provider has. An
instance the provider started is billing: whatever fails after that gives it back (stop, or
destroy by its policy) and says which, never leaving it recorded as stopped.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from orchestrator import config, parallel as par, states
from orchestrator.ledger import claims
from orchestrator.ssh import reach
from orchestrator.errors import AuthError, HostKeyMismatch, OrchError, ProviderError, StartRefused, UsageError
from orchestrator.instances.instance_ops import InstanceOps
from orchestrator.kill_points import kill_point
from orchestrator.provider import Provider, Remote, RentsGroups, Request, Status, Stoppable, can_stop
from orchestrator.provisioning import MACHINE, Provisioning, recalled, remembered
from orchestrator.text import why as _why

if TYPE_CHECKING:  # SQLAlchemy and SQLModel load with the ledger, when it is opened (0.3 s)
    from orchestrator.ledger.ledger import Instance

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
MAX_DISK_GB = 20_000
MAX_GPUS = 16
START_TIMEOUT_MINUTES = 5.0  # how long `orch start` waits for a provider to give the GPU back


def check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UsageError(f"invalid name {name!r}: use 1-40 lowercase letters, digits and '-', starting "
                         "with a letter or digit")


def check_request(name: str, request: Request) -> None:
    check_name(name)
    if not 1 <= request.disk_gb <= MAX_DISK_GB:
        raise UsageError(f"--disk must be between 1 and {MAX_DISK_GB} GB, not {request.disk_gb}")
    if not 1 <= request.gpus <= MAX_GPUS:
        raise UsageError(f"--gpus must be between 1 and {MAX_GPUS}, not {request.gpus}")
    if request.bid is not None and not 0 < request.bid < 1000:
        raise UsageError(f"--bid must be a price in $/hr per GPU between 0 and 1000, not {request.bid}")
    if request.bid is not None and not request.spot:
        raise UsageError("--bid is a spot price: add --spot")
    if request.cpu and request.gpu:
        raise UsageError("--cpu and --gpu exclude each other")
    for text, what in ((request.gpu, "--gpu"), (request.image, "--image"), (request.offer, "--offer")):
        if text is not None and (not text.strip() or any(not c.isprintable() for c in text) or len(text) > 200):
            raise UsageError(f"{what} takes a printable value of at most 200 characters")


class LazyLedger:
    """The ledger, opened (SQLAlchemy imported, the schema checked) at its first real use. Its
    ``url``, ``sqlite`` and ``path`` answer without opening it (``snapshot`` and ``claims`` need no more)."""

    def __init__(self, url: str):
        import threading

        self.url = url
        self.sqlite = url.startswith("sqlite")
        self.path = config.sqlite_path(url) if self.sqlite else None
        self._opened = None
        self._lock = threading.Lock()  # the reaper's parallel looks may be first to need it

    def set_meta(self, key: str, value: str) -> None:
        """Unopened, on SQLite: written with the standard library (a reaper pass that changed nothing
        opens no SQLAlchemy); opened, or elsewhere: the ledger's own ``set_meta``."""
        from orchestrator.ledger import ledger_sql

        if self._opened is None and self.path is not None and ledger_sql.set_meta(self.path, key, value):
            return
        self.__getattr__("set_meta")(key, value)

    def __getattr__(self, name: str):
        with self._lock:
            if self._opened is None:
                from orchestrator.ledger.ledger import Ledger

                self._opened = Ledger(self.url)
        return getattr(self._opened, name)


class Orch(InstanceOps):
    """What every command needs: the ledger, orch's home, who is acting, where to report
    (``InstanceOps``: with the provider of a row, a state moved, SSH, a destroy), and the lifecycle."""

    @classmethod
    def open(cls, actor: str = "cli", say: Callable[[str], None] | None = None, lazy: bool = False) -> "Orch":
        """``lazy``: the ledger opens on first use, so a command that may not need it (``orch offers``)
        or reads it whole through ``snapshot`` (``orch cost``, ``orch reap --dry-run``) never pays
        for SQLAlchemy."""
        home = config.home()
        url = config.database_url(home)  # refuses a URL that would lose the ledger before anything is made
        if home.exists() and not home.is_dir():
            raise UsageError(f"orch's home {home} is not a folder (ORCH_HOME)")
        try:
            home.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise OrchError(f"cannot make orch's home {home}: {e.strerror or e}") from None
        if lazy:
            orch = cls(LazyLedger(url), home, actor)
        else:
            from orchestrator.ledger.ledger import Ledger

            orch = cls(Ledger(url), home, actor)
        if say:
            orch.say = say
        from orchestrator import notify
        from orchestrator.provider import plugins
        from orchestrator.ssh import sshconfig

        for listener in (sshconfig, notify):  # orch's own listeners of every transition
            plugins.listen(listener)
        for warning in config.warnings(home):
            orch.say(f"orch: warning: {warning}")
        return orch

    # -- up: one path for 1..N machines ---------------------------------------------------
    @claims.exclusive
    def up(self, name: str, provider_name: str, request: Request, ssh_timeout: float | None = None,
           policy: str | None = None, after_verify: Callable[[Instance], None] | None = None,
           prepare: Provisioning | None = MACHINE, group: dict | None = None,
           halted: Callable[[], str | None] | None = None) -> Instance:
        """One machine: ``up_nodes`` for a group of one, under its name's claim. Rent, wait for SSH,
        provision as ``prepare`` says and verify (None: reached over SSH only, as ``orch check`` and a
        command job want), ``after_verify``, arm the watchdog. What fails after the create destroys.
        An interrupted ``orch up NAME`` is finished by the next one (``reconcile.leftover``).
        ``group``: the node's group fields on its row (a replacement node, ``groups.replace_node``);
        ``halted``: why the bring-up is called off (``bring_up``), asked before anything is rented too."""
        from orchestrator.instances.reconcile import leftover

        self.check_up(provider_name, request, [name], [request], halted)
        inst = leftover(self, name, provider_name, request)  # what an interrupted `orch up` left
        if inst is not None:
            self.say(f"[1/{_steps(prepare)}] resuming {inst.label} ({inst.provider_id}), left {inst.state} by an "
                     "interrupted `orch up`")
        launch = (lambda ready: after_verify(ready[0])) if after_verify else None
        return self.up_nodes(provider_name, [name], [request], policy, [group or {}], ssh_timeout=ssh_timeout,
                             launch=launch, prepare=prepare, halted=halted,
                             made=[inst] if inst is not None else None)[0]

    def check_up(self, provider_name: str, whole: Request, names: list[str], requests: list[Request],
                 halted: Callable[[], str | None] | None = None) -> Provider:
        """Every node's name and request checked, and the provider's word on the rental as a whole
        (``whole``: a local group shares the GPUs), before anything is made."""
        for name, req in zip(names, requests):
            check_request(name, req)
        provider = self.provider(provider_name)
        provider.validate(whole)
        provider.require_credentials()
        why = halted() if halted else None
        if why:
            raise OrchError(why)
        return provider

    def up_nodes(self, provider_name: str, names: list[str], requests: list[Request], policy: str | None,
                 fields: list[dict], *,
                 ssh_timeout: float | None = None, launch: Callable[[list[Instance]], None] | None = None,
                 prepare: Provisioning | None = MACHINE, halted: Callable[[], str | None] | None = None,
                 made: list[Instance] | None = None) -> list[Instance]:
        """The one bring-up, for 1..N machines of one offer (SkyPilot's ``run_instances`` with a
        count: a machine is a group of one). ``names``, ``requests`` and ``fields`` (each row's
        group fields) in rank order. Every row first, before anything can bill; one create for them all; every
        node from created to ready at once, called off together at the first failure or Ctrl-C;
        then ``launch`` once, on every node (rank order), before rank 0's watchdog is armed.
        Whatever fails destroys every node made and raises the failing node's own error
        (``node_rank`` on it). ``made``: rows an interrupted ``orch up`` left, created already."""
        provider = self.provider(provider_name)
        rows = made or self._rent(provider_name, provider, names, requests, policy, fields, prepare)
        return self._bring_up_all(provider, rows, ssh_timeout, launch, halted)

    def _rent(self, provider_name: str, provider: Provider, names: list[str], requests: list[Request],
              policy: str | None, fields: list[dict], prepare: Provisioning | None) -> list[Instance]:
        """Every row (``requested``), then one create for every node, each row then ``provisioning``.
        A failure after the provider may have made some destroys what it made."""
        rows = [self.record_new(name, provider_name, req, policy, f) for name, req, f in zip(names, requests, fields)]
        several = f"{len(rows)} nodes " if len(rows) > 1 else ""  # the line names the count of a group only
        self.say(f"[1/{_steps(prepare)}] renting {several}on {provider_name} as {rows[0].label}"
                 f"{' ...' if several else ''}")
        kill_point("before-create")
        remotes = self._create_all(provider, rows, requests)
        try:
            kill_point("create-returned")
            return [self.created(row, provider, remote, prepare) for row, remote in zip(rows, remotes)]
        except BaseException as e:
            self._down_made(rows, f"the create could not finish: {_why(e)}")
            raise

    def _create_all(self, provider: Provider, rows: list[Instance], requests: list[Request]) -> list[Remote]:
        """One call makes every node. One machine is the provider's ``create`` (``_create``: its
        label looked up when it errs); several are ``RentsGroups.create_nodes`` after ``open_group``
        (EC2's MinCount=MaxCount; Lambda's one launch per node), each label then looked up
        (``_settle_unmade``) and what was made destroyed before the error goes on."""
        _, public_key = config.ssh_key()
        if len(rows) == 1:
            return [self._create(provider, rows[0], requests[0], public_key)]
        try:
            provider.open_group(rows[0].group_id, requests[0])
            remotes = provider.create_nodes(requests, [r.label for r in rows], public_key)
            if len(remotes) != len(rows):
                raise OrchError(f"{provider.name} made {len(remotes)} of the group's {len(rows)} nodes")
        except BaseException as e:
            self._settle_unmade(provider, rows, _why(e), getattr(e, "node_rank", None))
            self._down_made(rows, f"the group could not be rented: {_why(e)}")
            raise
        return remotes

    def _settle_unmade(self, provider: Provider, rows: list[Instance], why: str, failed_rank: int | None) -> None:
        """After a failed group create: a node the provider never made is ``failed`` (nothing bills);
        one it made (before ``failed_rank``, where the provider says which failed) is left to
        ``_down_made``, and so is a node whose lookup fails (its destroy looks again, reconcile after)."""
        for node in (self.ledger.get(r.id) for r in rows):
            if node.state != states.REQUESTED or node.provider_id:
                continue
            if failed_rank is not None and (node.node_rank or 0) < failed_rank:
                continue
            try:
                found = provider.find(node.label)
            except ProviderError:
                continue
            if found is None:
                self.move(node, states.FAILED, f"create failed: {why}")

    def _bring_up_all(self, provider: Provider, made: list[Instance], ssh_timeout: float | None,
                      launch: Callable[[list[Instance]], None] | None,
                      halted: Callable[[], str | None] | None) -> list[Instance]:
        """Every node from created to ready: rank 0 on this thread (where Ctrl-C arrives: it ends
        its step at once), the others one thread each. The first failure calls the others off (their
        waits check ``halt``), and so does Ctrl-C; every node made is destroyed before the error goes
        on, so nothing bills. ``launch`` runs on this thread once every node is ready."""
        import threading

        halt: list[str] = []  # why the bring-up was called off: set once, by the first failure or Ctrl-C
        first: list[int] = []  # the rank whose own failure called it off
        lock = threading.Lock()
        results: list = [None] * len(made)
        errors: list = [None] * len(made)
        done = [threading.Event() for _ in made]  # not Thread.join: one interrupted by Ctrl-C can return early (3.11)
        began: list = []  # rank 0's bring-up began (on this thread)

        def stop_why() -> str | None:
            return halt[0] if halt else (halted() if halted else None)

        def launch_on_all(head: Instance) -> None:  # rank 0's after_verify: once every other node is ready
            for d in done[1:]:
                while not d.wait(0.2):
                    pass
            why = stop_why()
            if why:
                raise OrchError(why)
            if launch is not None:
                launch([head] + [self.ledger.get(i.id) for i in results[1:]])

        def bring(rank: int) -> None:
            node = made[rank]
            # A group's lines say which node speaks; one machine's are its own.
            mine = replace(self, say=lambda m, node=node.name: self.say(f"[{node}] {m}")) if len(made) > 1 else self
            try:
                results[rank] = mine.bring_up(node, provider, ssh_timeout, halted=stop_why,
                                              after_verify=launch_on_all if rank == 0 else None)
            except BaseException as e:
                errors[rank] = e
                with lock:
                    if not halt:
                        first.append(rank)
                        halt.append(f"node {rank} of the group failed ({_why(e)}): its bring-up was called off")
                if rank == 0:
                    raise
            finally:
                done[rank].set()

        threads = [threading.Thread(target=bring, args=(r,), name=f"orch-node-{r}", daemon=True)
                   for r in range(1, len(made))]
        try:
            with par.ctrl_c_held():  # every node's thread starts, or Ctrl-C would leave one never begun
                for t in threads:
                    t.start()
            began.append(0)
            bring(0)
        except BaseException as e:
            interrupted = isinstance(e, KeyboardInterrupt)
            with lock:
                if interrupted:
                    halt.insert(0, "interrupted (Ctrl-C): the group's bring-up was called off")
            for r, d in enumerate(done):  # each node destroys itself as it stops (its provisioning step ends first)
                if r or began:  # rank 0's bring-up, on this thread, may never have begun (Ctrl-C before it)
                    d.wait(600)
            rank = 0 if interrupted or not first else first[0]
            error = e if interrupted else errors[rank]
            self._down_made(made, "interrupted (Ctrl-C) while it came up" if interrupted else
                            f"node {rank} of {len(made)} could not be had: {_why(error)}")
            if not isinstance(error, KeyboardInterrupt):
                error.node_rank = rank  # which node's error it is (``groups.up`` names it)
            if error is e:
                raise
            raise error from None
        return [self.ledger.get(i.id) for i in results]

    def _down_made(self, rows: list[Instance], reason: str) -> None:
        """Every live node of ``rows`` destroyed at once, then what the provider made for their group
        (``groups.down``, which this is)."""
        self.down_all([self.ledger.get(r.id) for r in rows], reason)

    def down_all(self, nodes: list[Instance], reason: str) -> list[Instance]:
        """Destroy every node at once; then what the provider made for the group. Raises when a node
        could not be destroyed (after trying them all: the others are gone)."""
        live_nodes = [n for n in nodes if self.ledger.get(n.id).state in states.LIVE]
        # Gathered: a node that could not be destroyed stops none of the others.
        outcomes = par.each(lambda node: self.down(self.ledger.get(node.id), reason), live_nodes, len(live_nodes))
        errors = [(node, e) for node, (_, e) in zip(live_nodes, outcomes) if e is not None]
        if errors:
            node, error = errors[0]
            raise OrchError(f"could not destroy {node.name} ({_why(error)}): it may bill; `orch down "
                            f"{node.group_name or node.name}` again")
        group = nodes[0].group_id if nodes else None
        provider = self.provider(nodes[0].provider) if group and not self._group_lives(group) else None
        if isinstance(provider, RentsGroups):  # what its nodes shared, once none of them lives
            try:
                provider.close_group(nodes[0].group_id)
            except OrchError as e:
                self.say(f"orch: warning: the group's shared resources at {nodes[0].provider} were not removed "
                         f"({_why(e)}); nothing there bills, `orch reconcile` tries again")
        return [self.ledger.get(n.id) for n in nodes]

    def _group_lives(self, group: str) -> bool:
        """Whether a node of ``group`` is live (a lone replacement's failure leaves its siblings)."""
        from sqlmodel import select

        from orchestrator.ledger.ledger import Instance

        with self.ledger.session(write=False) as s:
            return s.exec(select(Instance.id).where(Instance.group_id == group,
                                                    Instance.state.in_(states.LIVE))).first() is not None

    def record_new(self, name: str, provider_name: str, request: Request, policy: str | None,
                   group: dict | None = None) -> Instance:
        """The instance's row, before anything can bill (``requested``), with the volumes it mounts."""
        inst = self.ledger.create_instance(
            actor=self.actor, name=name, provider=provider_name, label="", gpu=request.gpu,
            gpus=0 if request.cpu else request.gpus, cpu_only=request.cpu, disk_gb=request.disk_gb,
            image=request.image, spot=request.spot, bid=request.bid, policy=policy, **(group or {}))
        if request.mounts:
            from orchestrator.volumes import volume_mounts

            volume_mounts.record(self, inst, request.mounts)
        return inst

    def created(self, inst: Instance, provider: Provider, remote: Remote,
                prepare: Provisioning | None = MACHINE) -> Instance:
        """The provider made it: its id and prices on the row (``provisioning``), and what makes it
        ready once SSH answers remembered there (``_prepare`` runs it, after every start too)."""
        price, stopped = provider.prices(remote)
        inst = self.move(inst, states.PROVISIONING, f"created {remote.provider_id}",
                         provider_id=remote.provider_id, price_hr=price, stopped_price_hr=stopped,
                         gpu_name=remote.gpu_name)
        kill_point("after-create")
        if prepare != MACHINE:
            self.ledger.remember(inst.id, prepare=remembered(prepare))
        return inst

    def bring_up(self, inst: Instance, provider: Provider, ssh_timeout: float | None = None,
                 after_verify: Callable[[Instance], None] | None = None,
                 halted: Callable[[], str | None] | None = None) -> Instance:
        """From created to ready: SSH, provisioning, the proof, ``after_verify``. Whatever fails
        (``halted`` saying why: a sibling node failed, Ctrl-C) destroys it before the error goes on."""
        try:
            def check() -> None:
                why = halted() if halted else None
                if why:
                    raise OrchError(why)

            timeout = ssh_timeout or float(config.get("ssh_timeout_minutes", 20)) * 60
            steps = _steps(recalled(self.ledger.recall(inst.id, "prepare")))
            self.say(f"[2/{steps}] waiting for SSH (up to {timeout / 60:.0f} min)")
            kill_point("ssh-wait")
            check()
            remote = reach.wait_ssh(provider, inst.provider_id, timeout, progress=lambda m: self.say(f"      {m}"),
                                    halted=halted)
            inst = self._endpoint(inst, provider, remote)
            kill_point("ssh-ready")
            check()
            inst = self._prepare(inst, after_verify=after_verify, halted=check)
        except BaseException as e:
            why = _why(e)
            self.say(f"failed: {why}; destroying {inst.label} so it does not keep billing")
            self._destroy(provider, self.ledger.get(inst.id), f"up failed: {why}")
            if isinstance(e, (KeyboardInterrupt, OrchError)):
                raise
            raise OrchError(f"up failed: {why}") from e
        return inst

    def _prepare(self, inst: Instance, started: bool = False, rekey: bool = False,
                 after_verify: Callable[[Instance], None] | None = None,
                 halted: Callable[[], None] | None = None) -> Instance:
        """Provision as the row remembers (idempotent; ``orchestrator.provisioning``), prove the device
        with a matmul, record ready, arm the watchdog (after a start: learn first what the last
        watchdog did, its state file survives a stop)."""
        from orchestrator.volumes import volume_mounts
        from orchestrator.instances import watchdog
        from playbooks.provision import provision, verify

        volume_mounts.make_ready(self, inst)  # every volume at its path before anything runs there
        steps = recalled(self.ledger.recall(inst.id, "prepare"))
        if steps is None:
            from orchestrator.ssh import remote

            with self.connect(inst, rekey=rekey) as c:
                remote.run(c, "true")
            inst = self.move(inst, states.READY, "reached over SSH (not provisioned: orch check, or a command "
                                                 "job, whose setup is its own)")
            if after_verify:
                after_verify(inst)
            (watchdog.rearm if started else watchdog.arm)(self, inst)
            return inst
        self.say(f"[3/4] provisioning ({steps.says})")
        with self.connect(inst, rekey=rekey) as c:
            facts = provision(c, gpu=not inst.cpu_only, log=lambda m: self.say(f"      {m}"), steps=steps)
            kill_point("provisioned")
            if halted:
                halted()
            self.say("[4/4] verifying: a 2000x2000 matmul on the device")
            proof = verify(c, gpu=not inst.cpu_only, facts=facts)
        device = f"{proof['device']} (torch {facts['torch']}, matmul sum {proof['result']:.1f}{_proved(proof)})"
        verified = "started and verified on" if started else "verified on"
        inst = self.move(inst, states.READY, f"{verified} {proof['device']}", device=device[:255])
        if after_verify:
            after_verify(inst)
        (watchdog.rearm if started else watchdog.arm)(self, inst)
        return inst

    def _create(self, provider: Provider, inst: Instance, request: Request, public_key: str) -> Remote:
        try:
            return provider.create(request, inst.label, public_key)
        except BaseException as e:
            if isinstance(e, AuthError):
                # Refused for its credentials (or none to send): the provider made nothing, and a
                # lookup with the same credentials could not say so. Settled now, never left requested.
                self.move(inst, states.FAILED, f"create failed: {_why(e)}")
                raise
            # The provider may have created it before failing: look before giving up.
            try:
                found = provider.find(inst.label)
            except ProviderError as lookup:
                self.ledger.note(inst.id, f"create failed ({_why(e)}) and the lookup failed too "
                                          f"({_why(lookup)}): reconcile will settle it", self.actor)
                raise ProviderError(f"creating {inst.label} failed and {provider.name} could not say whether it "
                                    f"was made anyway ({_why(lookup)}): the next reaper pass (or `orch reconcile`) "
                                    "settles it once it answers again") from e
            interrupted = not isinstance(e, Exception)  # Ctrl-C: the user wants nothing more made or used
            if found is not None and found.status in (Status.RUNNING, Status.PENDING) and not interrupted:
                self.say(f"      the create errored ({_why(e)}) but {found.provider_id} exists: using it")
                return found
            if found is not None:
                # A leftover that will not run (a just-taken offer can leave a stopped instance), or one
                # made while Ctrl-C cut the call: ours, and it bills. Never adopted: destroyed, and the
                # create fails (the Ctrl-C goes on as a Ctrl-C).
                why = (f"interrupted (Ctrl-C) while {found.provider_id} was made" if interrupted else
                       f"create failed ({_why(e)}) and left {found.provider_id} {found.status.value}")
                inst = self.move(inst, states.DESTROYING, f"{why}: destroying it", provider_id=found.provider_id)
                provider.destroy(found.provider_id)
                self.move(inst, states.DESTROYED, "the failed create's leftover, destroyed")
                raise
            self.move(inst, states.FAILED, f"create failed: {_why(e)}")
            raise

    def _endpoint(self, inst: Instance, provider: Provider, remote: Remote) -> Instance:
        ep = remote.endpoint
        fields = dict(ssh_host=ep.host, ssh_port=ep.port, ssh_user=ep.user)
        from orchestrator.nodes import is_plain_ip

        if remote.private_ip and is_plain_ip(remote.private_ip):  # a scope id or a name never reaches a node's env
            fields["private_ip"] = remote.private_ip
        if not inst.host_key:
            vouched = provider.vouched_host_key(remote.provider_id)
            if vouched:
                fields["host_key"] = vouched
        return self.ledger.update(inst.id, **fields)

    # -- stop / start -----------------------------------------------------------
    @claims.exclusive
    def stop(self, inst: Instance, reason: str = "stopped by the user") -> Instance:
        provider = self.provider(inst.provider)
        if not can_stop(provider, inst.spot):
            what = "this spot instance" if isinstance(provider, Stoppable) else inst.provider
            raise UsageError(f"stop is not supported by {what}: use `orch down {inst.name}`")
        if inst.state == states.STOPPED:
            return inst
        inst = self.move(inst, states.STOPPING, reason,
                         expect=(states.READY, states.PROVISIONING, states.PREEMPTED, states.UNATTENDED,
                                 states.SCHEDULING, states.BROKEN))
        try:
            provider.stop(inst.provider_id)
        except BaseException as e:
            self.move(inst, states.READY, f"stop failed: {_why(e)}")
            raise
        return self.move(inst, states.STOPPED, reason)

    @claims.exclusive
    def start(self, inst: Instance, reason: str = "started by the user", timeout: float | None = None) -> Instance:
        """Start a stopped instance and make it ready again: wait (``timeout`` seconds, default
        START_TIMEOUT_MINUTES) for the provider to run it, then SSH, provisioning, verify and the
        watchdog, as after ``up``. A start that does not run in time is stopped again (exit 1)."""
        provider = self.provider(inst.provider)
        if inst.state == states.READY:
            return inst
        if not can_stop(provider, inst.spot):
            raise UsageError(f"start is not supported by {inst.provider}: an instance it cannot stop is never stopped")
        rekey = provider.new_host_key_on_start
        if inst.state == states.UNATTENDED and rekey:
            # Its new host key came from a start orch did not ask for: stop it, then start it ourselves.
            inst = self.stop(inst, "stopped to be started by orch (it was running unattended)")
        inst = self.move(inst, states.STARTING, reason,
                         expect=(states.STOPPED, states.PREEMPTED, states.SCHEDULING, states.UNATTENDED))
        try:
            provider.start(inst.provider_id)
        except StartRefused as e:
            self.move(inst, states.STOPPED, f"start refused: {_why(e)}")
            raise
        except BaseException as e:
            return self._undo_start(inst, provider, f"start failed: {_why(e)}", e)
        wait = timeout if timeout is not None else float(config.get("start_timeout_minutes", START_TIMEOUT_MINUTES)) * 60
        try:
            inst = self._await_running(inst, provider, wait)
            ssh_wait = float(config.get("ssh_timeout_minutes", 20)) * 60
            remote = reach.wait_ssh(provider, inst.provider_id, ssh_wait, progress=lambda m: self.say(f"      {m}"))
            inst = self._endpoint(self.ledger.get(inst.id), provider, remote)
            price, stopped = provider.prices(remote)
            inst = self.ledger.update(inst.id, price_hr=price or inst.price_hr,
                                      stopped_price_hr=stopped or inst.stopped_price_hr)
            return self._prepare(inst, started=True, rekey=rekey)
        except _NoGPU as e:
            raise OrchError(str(e)) from None
        except BaseException as e:
            return self._undo_start(self.ledger.get(inst.id), provider, f"start failed: {_why(e)}", e)

    def _await_running(self, inst: Instance, provider: Provider, wait: float) -> Instance:
        """Until the provider runs it. Waiting for a GPU (scheduling) is recorded and shown; past
        ``wait`` the start is given up: stopped again at the provider and in the ledger."""
        deadline = time.monotonic() + wait
        while True:
            remote = provider.get(inst.provider_id)
            if remote.status == Status.RUNNING:
                if inst.state == states.SCHEDULING:
                    inst = self.move(inst, states.STARTING, "its host freed a GPU: running")
                return inst
            if remote.status in (Status.GONE, Status.BROKEN):
                raise ProviderError(f"{provider.name} shows it {remote.status.value} "
                                    f"{'(' + remote.detail + ')' if remote.detail else ''} instead of running")
            if remote.status == Status.SCHEDULING and inst.state == states.STARTING:
                inst = self.move(inst, states.SCHEDULING, "the start waits for its host to free a GPU"
                                 + (f" ({remote.detail})" if remote.detail else ""))
                self.say(f"      {inst.name} waits for a GPU on its host (scheduling); giving up after "
                         f"{wait / 60:.1f} min")
            if time.monotonic() >= deadline:
                provider.stop(inst.provider_id)
                inst = self.ledger.get(inst.id)
                self.move(inst, states.STOPPED, f"no GPU within {wait / 60:.1f} min of the start: stopped again "
                                                "so it does not start later unwatched")
                raise _NoGPU(f"{inst.name} did not get its GPU back within {wait / 60:.1f} min "
                             f"({remote.detail or remote.status.value}): stopped it again; `orch start {inst.name} "
                             "--timeout MINUTES` waits longer, `orch down` gives up its disk")
            par.nap(provider.poll_seconds)

    def _undo_start(self, inst: Instance, provider: Provider, why: str, error: BaseException):
        """A start failed after the provider may have started it: it may bill. Stop it again (or
        destroy it, by its policy, or where it cannot stop), record which, and raise."""
        from orchestrator.money import policy

        try:
            shown = provider.get(inst.provider_id).status
        except OrchError:
            shown = None
        if shown == Status.STOPPED:
            inst = self.ledger.get(inst.id)
            if inst.state in (states.STARTING, states.SCHEDULING):
                self.move(inst, states.STOPPED, why)
            raise error
        destroy = policy.of(inst).on_idle == "destroy" or not can_stop(provider, inst.spot)
        try:
            if destroy:
                self._destroy(provider, self.ledger.get(inst.id), f"{why}: destroyed so it does not bill")
            else:
                inst = self.ledger.get(inst.id)
                if inst.state != states.STOPPING:
                    inst = self.move(inst, states.STOPPING, why)
                provider.stop(inst.provider_id)
                self.move(inst, states.STOPPED, f"{why}: stopped again so it does not bill")
        except OrchError as e2:
            raise OrchError(f"{why}; and giving it back failed too ({_why(e2)}): it may bill, see `orch status "
                            f"{inst.name}`") from error
        what = "destroyed it" if destroy else f"stopped it again (`orch start {inst.name}` to retry)"
        if isinstance(error, HostKeyMismatch):
            what += (f"; its new host key came at a start orch asked for on a provider that keeps keys: refused. "
                     f"`orch down {inst.name}` if you do not trust it")
        if isinstance(error, KeyboardInterrupt):
            raise error
        raise OrchError(f"{why}; {what} so it does not bill") from error

    # -- refresh -----------------------------------------------------------------------
    def refresh(self, inst: Instance) -> Instance:
        """The ledger row in line with what its provider shows now (see ``sync``)."""
        from orchestrator.instances.sync import sync

        if inst.provider_id is None or inst.state not in states.LIVE:
            return inst
        return sync(self, inst, self.provider(inst.provider).get(inst.provider_id))


class _NoGPU(OrchError):
    """The start was given up: the instance is stopped again, the ledger says so."""


def _proved(proof: dict) -> str:
    """When the proof answered was made earlier in the instance's boot (``verify_device.remembered``)."""
    import math
    from datetime import datetime, timezone

    at = proof.get("proved_at")
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at) or not 0 < at < 2**33:
        return ""
    return f", proved {datetime.fromtimestamp(at, timezone.utc):%H:%M:%S} UTC this boot"


def _steps(prepare: Provisioning | None) -> int:
    """How many steps the bring-up's "[k/N]" lines count: rent and SSH, then provisioning and the proof
    where the machine gets them (a command job's gets SSH alone: "[2/4]" promised two more that never came)."""
    return 4 if prepare else 2


__all__ = ["Orch", "check_request", "check_name", "Request"]

