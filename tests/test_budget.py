"""A budget over everything orch rents (issue 58), on the local provider at the price config.toml
gives it: a job whose estimate does not fit is refused with nothing made; a running job that
crosses the budget is stopped by the watcher with what it wrote home and the reason ``budget``
(80 % said once first, both posted to the webhook); ``orch budget`` and ``orch cost --json`` show
what was spent, what running jobs commit and what is left.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from tests.clouds import vast, wait_for  # noqa: F401  (vast: the fake Vast.ai fixture)
from tests.conftest import needs_torch, run_orch
from tests.fakes.webhook import Hook
from tests.test_notify import write_config
from tests.test_tasks import live_instances, nothing_created, write
from tests.test_watcher import WATCHED, ledger


def test_a_job_or_an_instance_whose_estimate_does_not_fit_the_budget_is_refused_with_nothing_made(orch_home):
    write_config(orch_home, "[providers.local]\nprice_per_hour = 36.0\n\n[budget]\ndaily_usd = 1\n")
    # $36/hr for --max-hours 1: $36, over the $1 a day
    proc = run_orch("run", "big", "--cpu", "--max-hours", "1", "--", "echo", "hi")
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("orch: error:")]
    assert len(error) == 1 and "budget" in error[0] and "$36.0000" in error[0] and "$1 " in error[0], proc.stderr
    up = run_orch("up", "box", "--cpu", "--max-hours", "1")
    assert up.returncode == 2 and "budget" in up.stderr, up.stderr
    nothing_created(orch_home)
    dry = run_orch("run", "big", "--cpu", "--max-hours", "1", "--dry-run", "--", "echo", "hi", check=0)
    assert "budget: refused" in dry.stderr, dry.stderr
    fits = run_orch("run", "small", "--cpu", "--max-hours", "0.01", "--dry-run", "--", "echo", "hi", check=0)
    assert "budget: fits, $0.3600 of $1.0000 left" in fits.stderr, fits.stderr
    nothing_created(orch_home)


def test_a_running_job_that_crosses_the_budget_is_stopped_with_its_outputs_home_and_reason_budget(orch_home, tmp_path):
    hook = Hook()
    # $0.1 a second: the $2 of the day are spent some 20 s after the machine is made
    write_config(orch_home, f'[providers.local]\nprice_per_hour = 360.0\n\n[budget]\ndaily_usd = 2\n\n'
                            f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["budget"]\n')
    task = write(tmp_path / "task.yaml", """
        name: spender
        resources: {cpu: true, provider: local}
        run: mkdir -p out && echo written-before > out/partial.txt && sleep 3600
        outputs: [out]
        """)
    run_orch("run", "-f", task, env=WATCHED, check=0)  # no estimate (no --max-hours): it fits what is left
    wait_for(lambda: ledger().job("spender").state != "running" and ledger().job("spender").state != "planned",
             timeout=180, what="the budget to stop the job")
    job = ledger().job("spender")
    assert job.state == "stopped" and job.reason.startswith("budget: the daily budget $2 is spent"), job.reason
    assert (orch_home / "runs" / "spender" / "out" / "partial.txt").read_text() == "written-before\n"
    assert live_instances() == []
    texts = hook.texts()
    warned = [t for t in texts if re.search(r"budget: (8\d|9\d) % of the daily budget \$2 spent", t)]
    assert len(warned) == 1, texts  # at 80 %, once
    assert any("the daily budget $2 is spent" in t and "jobs stopped: spender" in t for t in texts), texts
    hook.close()
    shown = run_orch("budget", check=0).stdout  # crossed: what it is over by, not "left $-0.5756"
    assert "$-" not in shown and re.search(r"nothing left \(\$\d+\.\d{4} over\)", shown), shown


def test_orch_budget_and_orch_cost_show_spent_committed_and_left(orch_home):
    write_config(orch_home, "[providers.local]\nprice_per_hour = 36.0\n\n[budget]\ndaily_usd = 10\n"
                            'monthly_usd = 100\ntimezone = "Europe/Madrid"\n')
    run_orch("run", "held", "--cpu", "--max-hours", "0.1", "--", "sleep", "3600", check=0)  # $3.6 committed
    wait_for(lambda: json.loads(run_orch("budget", "--json", check=0).stdout)["periods"][0]["spent"]["instances"] > 0,
             timeout=60, what="the running job's spend")
    shown = json.loads(run_orch("budget", "--json", check=0).stdout)
    cost = json.loads(run_orch("cost", "--json", check=0).stdout)["budget"]
    run_orch("jobs", "cancel", "held", check=0)
    for got in (shown, cost):
        assert got["timezone"] == "Europe/Madrid" and [p["period"] for p in got["periods"]] == ["daily", "monthly"]
        daily = got["periods"][0]
        spent = daily["spent"]["total"]
        assert 0 < spent == daily["spent"]["instances"] and daily["spent"]["volumes"] == 0
        [job] = got["jobs"]
        assert job["name"] == "held" and job["estimate"] == 3.6
        assert abs(job["committed"] - (3.6 - job["spent"])) < 1e-6 and got["committed_usd"] == job["committed"]
        assert abs(daily["left_usd"] - (10 - spent - job["committed"])) < 1e-4, daily
    text = run_orch("budget", check=0).stdout
    assert text.startswith("budget daily    $10 since ") and "Europe/Madrid: spent $" in text, text


# -- the spot notice reaches the job ----------------------------------------------------------------
def test_a_spot_notice_reaches_the_command_and_the_checkpoint_is_copied_at_once(orch_home, tmp_path):
    from tests.fakes.imds import Metadata

    imds = Metadata()
    write_config(orch_home, f'[providers.local]\nmetadata_url = "{imds.url}"\n')
    # The command saves on SIGTERM (with the notice the file holds) and ends; its checkpoint folder
    # is copied every 600 minutes only, so a copy now is the notice's.
    task = write(tmp_path / "task.yaml", """
        name: noticed
        resources: {cpu: true, provider: local}
        retries: 0
        checkpoint: ckpt
        checkpoint_minutes: 600
        run: |
          trap 'echo TERM > "$ORCH_CHECKPOINT_DIR/signal.txt"; cp "$ORCH_PREEMPT_FILE" "$ORCH_CHECKPOINT_DIR/notice.json"; exit 143' TERM
          echo started > "$ORCH_CHECKPOINT_DIR/step"
          sleep 3600 & wait
        """)
    run_orch("run", "-f", task, env=WATCHED, check=0)
    wait_for(lambda: ledger().job("noticed").state == "running"
             and imds.asked("/latest/meta-data/spot/instance-action") >= 1, timeout=120,
             what="the job running and its watchdog asking the metadata service")
    imds.interrupt("terminate", "2026-12-07T08:22:00Z")
    wait_for(lambda: ledger().job("noticed").state not in ("running", "recovering", "planned"), timeout=120,
             what="the noticed attempt to end")
    job = ledger().job("noticed")
    copies = sorted((orch_home / "jobs" / "noticed").glob("ckpt-*"))
    assert copies, job.history
    newest = copies[-1]
    assert (newest / "signal.txt").read_text() == "TERM\n", job.history  # the command saw SIGTERM
    assert json.loads((newest / "notice.json").read_text())["action"] == "terminate"  # and the file
    assert "spot interruption notice (terminate at 2026-12-07T08:22:00Z)" in job.history, job.history
    assert "the command ended" in job.reason and job.state == "failed", job.reason  # lost, no retries left
    assert live_instances() == []
    imds.close()
    preempted = ledger().preemptions(datetime.now(timezone.utc) - timedelta(hours=1))
    assert [(p.provider, p.instance_name) for p in preempted] == [("local", "noticed-a1")], preempted


# -- a place that just preempted is avoided ----------------------------------------------------------
def test_a_place_that_just_preempted_is_ranked_last_for_the_next_plan_and_left_out_on_request(orch_home, vast):
    fake, env = vast
    args = ("run", "pick", "--provider", "vastai", "--gpu", "RTX 4090", "--spot", "--dry-run", "--", "echo", "hi")
    before = run_orch(*args, env=env, check=0)
    assert "(offer 1001)" in _plan_line(before), before.stderr  # the cheapest good offer: 1001, in Sweden
    # Its spot market took a machine there an hour ago (as a job's attempt records it: provider, place, GPU)
    ledger().add_preemption(provider="vastai", place="Sweden, SE", gpu="RTX 4090", instance_name="old-a1",
                            reason="instance preempted", at=datetime.now(timezone.utc) - timedelta(hours=1))
    after = _plan_line(run_orch(*args, env=env, check=0))
    assert "(offer 1007)" in after.split(";")[0], after  # the next best, in Texas, rents
    assert "ranked last, preempted within 6 h: vastai Sweden, SE (1.0 h ago)" in after, after
    config = (orch_home / "config.toml").read_text()
    write_config(orch_home, "preempted_hours = 0.5\n" + config)
    assert "(offer 1001)" in _plan_line(run_orch(*args, env=env, check=0))  # an hour is past 0.5 h
    write_config(orch_home, config)
    only = run_orch(*args[:-3], "--gpu", "RTX 4090", "--avoid-preempted", "--", "echo", "hi", env=env, check=0)
    assert "left out, preempted within 6 h: vastai Sweden, SE" in _plan_line(only), only.stderr


def _plan_line(proc) -> str:
    return next(line for line in proc.stderr.splitlines() if line.startswith("plan: ") and "asking" not in line)


@needs_torch
def test_a_spot_notice_to_a_libreyolo_training_takes_its_checkpoint_copy_at_once(orch_home, tmp_path):
    from orchestrator.tasks import dataset
    from tests.fakes.hf_hub import FakeHub
    from tests.fakes.imds import Metadata
    from tests.test_training import TRAIN

    imds = Metadata()
    write_config(orch_home, f'[providers.local]\nmetadata_url = "{imds.url}"\n')
    ds = dataset.synth(tmp_path / "ds", n_train=8, n_val=4)
    with FakeHub(tmp_path) as hub:  # --push-to: LibreYOLO's Python API, with orch's callbacks
        env = {**WATCHED, **hub.env, "HF_TOKEN": hub.token}
        run_orch("run", "tn", "--data", ds, "--epochs", "200", "--push-to", "hf://acme/tn", *TRAIN, "--retries", "0",
                 env=env, check=0)
        wait_for(lambda: (ledger().job("tn").epoch or 0) >= 2, timeout=300, what="two epochs trained")
        trained = ledger().job("tn").epoch
        imds.interrupt()
        wait_for(lambda: ledger().job("tn").state not in ("running", "recovering", "planned"), timeout=300,
                 what="the noticed training to end")
    job = ledger().job("tn")
    assert "spot interruption notice (terminate at 2026-12-07T08:22:00Z) on tn-a1: taking the checkpoint copy now" \
        in job.history, job.history
    assert "spot interruption notice (terminate" in job.reason and "the training crashed" in job.reason, job.reason
    assert job.checkpoint_epoch >= trained - 1, (job.checkpoint_epoch, trained)  # the epochs it had, home
    assert live_instances() == []
    imds.close()


def test_a_schedules_run_that_does_not_fit_the_budget_is_skipped_with_the_reason_and_the_webhook(orch_home, tmp_path):
    hook = Hook()
    write_config(orch_home, f'[providers.local]\nprice_per_hour = 36.0\n\n[budget]\ndaily_usd = 1\n\n'
                            f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["schedule"]\n')
    task = write(tmp_path / "nightly.yaml", "name: nightly\nresources: {cpu: true}\nmax_hours: 1\nrun: 'true'\n")
    run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", check=0)
    ran = run_orch("schedule", "run", "nightly")
    assert "refused by the budget" in ran.stdout + ran.stderr, ran.stdout + ran.stderr
    assert any("skipped" in t and "refused by the budget" in t for t in hook.texts()), hook.texts()
    nothing_created(orch_home)
    hook.close()


def test_a_schedules_run_refused_by_a_limit_exits_as_orch_run_refused_by_it_does(orch_home, tmp_path):
    """`orch run` refused by the budget exits 2 (a limit the user set: one line, nothing made);
    `orch schedule run` skipped for the same reason, or for the schedule's own --max-cost, exited 1,
    as a failure would."""
    task = write(tmp_path / "nightly.yaml", "name: nightly\nresources: {cpu: true}\nmax_hours: 1\nrun: 'true'\n")
    write_config(orch_home, "[providers.local]\nprice_per_hour = 36.0\n\n[budget]\ndaily_usd = 1\n")
    run_orch("run", "-f", task, check=2)
    run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", check=0)
    budget = run_orch("schedule", "run", "nightly")
    assert budget.returncode == 2 and ": skipped" in budget.stdout, (budget.returncode, budget.stdout, budget.stderr)
    assert "refused by the budget" in budget.stdout, budget.stdout

    write_config(orch_home, "[providers.local]\nprice_per_hour = 36.0\n")  # the schedule's own ceiling: the same rule
    run_orch("schedule", "add", "capped", "-f", task, "--cron", "0 2 * * *", "--max-cost", "5", check=0)
    capped = run_orch("schedule", "run", "capped")
    assert capped.returncode == 2 and "is over --max-cost $5" in capped.stdout, (capped.returncode, capped.stdout)
    nothing_created(orch_home)
