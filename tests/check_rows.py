"""Every check row of every step, and what proves it can fail (issue 33).

``ROWS`` holds one entry per row name as the package writes it, an f-string's fields written ``*``
("load *"). An entry is one of:

- ``Tests(id, ...)``: tests (``tests/test_x.py::test_name``, ``...::Class::test``, or one
  parametrized case ``...::test_name[case]``) that make the row FAIL or WARN for the reason it names.
  tests/conftest.py records the checks such a test creates and fails it when one of its rows never
  came out FAIL or WARN (see :func:`unproved`);
- ``Advisory(why)``: a row that can only warn or inform, and says "advisory" in its expected text;
- ``FailsAs(row, ...)``: a row that is never FAIL or WARN itself (it reports what passed, or what
  was not run); when what it reports goes wrong, the rows named fail instead, each with its tests.

tests/test_check_rows.py scans the package for the rows (:func:`scan`) and holds ``ROWS`` to them.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Union

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sparkbook"


class Tests(tuple):
    """The tests that make the row FAIL or WARN for its reason."""

    __test__ = False  # not a pytest class, whatever its name

    def __new__(cls, *ids: str) -> "Tests":
        return super().__new__(cls, ids)


@dataclass(frozen=True)
class Advisory:
    why: str


class FailsAs(tuple):
    """The rows that fail in this row's stead."""

    def __new__(cls, *rows: str) -> "FailsAs":
        return super().__new__(cls, rows)


Entry = Union[Tests, Advisory, FailsAs]

# the test files named most, each as the start of a test's id
REMEDIES, PREFLIGHT, HOST = "tests/test_remedies.py::", "tests/test_preflight.py::", "tests/test_host_health.py::"
SETUP = "tests/test_fabric.py::"
DAYONE = "tests/test_dayone.py::test_discover_plan_apply_reboot_and_restore_on_nodes_fresh_from_the_box"
FABRIC, COLLECTIVES = "tests/test_fabric_field.py::", "tests/test_collectives.py::"
NCCL, DISTRIBUTE = "tests/test_collectives_field.py::", "tests/test_distribute.py::"
RDMA = "tests/test_rdma.py::"
HEALTH = "tests/test_serving_health.py::"
THROTTLED = "tests/test_serving_lab.py::test_a_server_throttled_halfway_through_the_soak_fails_06s_drift_and_its_health_is_timed"
SERVING, SMOKE, BENCH = "tests/test_serving.py::", "tests/test_smoke.py::", "tests/test_bench.py::"
EXPIRY = "tests/test_expiry.py::"
UPGRADE = "tests/test_upgrade.py::"
SERVICE_CHECKS = ("tests/test_service.py::test_the_checks_fail_by_node_for_a_missing_stopped_or_unpinned_container"
                  "_and_an_endpoint_down")
EVERY_PREFLIGHT_ROW = REMEDIES + "test_every_failing_preflight_row_renders_its_remedy"  # every fact broken
SPARK_REPORT = PREFLIGHT + "test_a_spark_report_and_its_checks"  # a real Spark's report, the worker down
LAB_FAULT = PREFLIGHT + "test_fault_fails_the_right_check_on_the_right_node"  # lab: one planted fault each
PLANTED = ("tests/test_preflight_faults.py::"  # lab: a stale process, a skewed clock, full disks, a DHCP rail
           "test_stale_process_clock_skew_low_disk_and_a_dhcp_rail_on_the_planted_node_then_pass")
SWEEP_STOPPED = COLLECTIVES + "test_a_sweep_that_stopped_fails_where_and_a_container_left_fails_the_cleanup"
FAILED_COPY = DISTRIBUTE + "test_a_failed_copy_fails_with_the_command_and_the_remedy"
NO_IMAGE = SERVING + "test_an_image_absent_from_the_head_or_without_vllm_fails_alone"
OPTIONS = SERVING + "test_configured_options_are_checked_against_the_image"
STUBBED = SERVING + "test_what_was_read_with_the_platform_stubbed_warns_but_never_fails"
SERVE_OUTCOMES = SERVING + "test_the_serving_outcome_names_its_start_up_time_and_its_checks_the_cause"
NO_LEVEL = BENCH + "test_no_level_that_fits_fails_and_prompts_sized_without_tokenize_warn"

ROWS: dict[str, Entry] = {
    # ------------------------------------------------------------------------- 00 inventory
    # "reachable" is also 08's, "gpu" and "same *" also 01's (below)
    "reachable": Tests("tests/test_inventory.py::test_an_unreachable_node_fails_with_the_command_a_person_runs",
                       REMEDIES + "test_inventory_failures_render", REMEDIES + "test_teardown_failures_render"),
    "gpu": Tests(REMEDIES + "test_inventory_failures_render", EVERY_PREFLIGHT_ROW),
    "same *": Tests(REMEDIES + "test_inventory_failures_render", EVERY_PREFLIGHT_ROW,
                    HOST + "test_driver_and_firmware_differ_or_fall_outside_the_range"),

    # ------------------------------------------------------------------------- 01 preflight: reach
    "ssh": Tests(SPARK_REPORT, LAB_FAULT + "[node-down]"),
    "ssh *→worker": Tests(EVERY_PREFLIGHT_ROW, LAB_FAULT + "[node-down]"),
    "tcp ports": Tests(PREFLIGHT + "test_tcp_checks_one_row_per_node_and_a_fail_per_blocked_port",
                       LAB_FAULT + "[firewall]"),
    "node checks": FailsAs("ssh"),  # SKIP: "not reachable: see the ssh check"

    # ------------------------------------------------------------------------- 01 preflight: nodes
    "memory": Tests(EVERY_PREFLIGHT_ROW),  # MemAvailable not reported
    "stale processes": Tests(SPARK_REPORT, PLANTED),
    "docker": Tests(EVERY_PREFLIGHT_ROW, LAB_FAULT + "[docker-down]"),
    "nvidia runtime": Tests(EVERY_PREFLIGHT_ROW),
    "clock": Tests(PREFLIGHT + "test_one_slow_clock_read_makes_no_skew_and_an_uncertain_one_only_warns", PLANTED),
    "ports free": Tests(SPARK_REPORT, LAB_FAULT + "[port-busy]"),
    "model disk": Tests(EVERY_PREFLIGHT_ROW, PLANTED),
    "docker disk": Tests(EVERY_PREFLIGHT_ROW, PLANTED),

    # ------------------------------------------------------------------------- 01 preflight: host health
    "driver": Tests(HOST + "test_driver_and_firmware_differ_or_fall_outside_the_range",
                    HOST + "test_a_version_that_does_not_parse_fails_naming_it"),
    "firmware": Tests(HOST + "test_driver_and_firmware_differ_or_fall_outside_the_range"),
    "gpu clocks": Tests(HOST + "test_a_slowdown_reason_names_itself_and_its_remedy",
                        HOST + "test_throttle_is_caught_on_its_node_only_and_heals"),
    "swap": Tests(HOST + "test_swap_in_use_before_the_launch_warns"),
    "rail dhcp": Tests(HOST + "test_a_rail_networkmanager_sets_by_dhcp_warns_with_the_nmcli_that_makes_it_static", PLANTED),
    "rail persisted": Tests(DAYONE),
    "fabric apply": Tests(DAYONE),
    "fabric plan": Tests(SETUP + "test_a_plan_that_cannot_be_applied_fails_its_row_per_node"),
    "fabric restore": Tests(SETUP + "test_a_refusing_node_fails_each_row_on_that_node_with_what_was_seen"),
    "ssh mesh": Tests(SETUP + "test_a_refusing_node_fails_each_row_on_that_node_with_what_was_seen"),
    "ssh mesh restore": Tests(SETUP + "test_a_refusing_node_fails_each_row_on_that_node_with_what_was_seen"),

    # ------------------------------------------------------------------------- 01 preflight: fabric
    "fabric layout": Tests(PREFLIGHT + "test_the_layout_check_one_row"),
    "rail map": Tests(EVERY_PREFLIGHT_ROW, LAB_FAULT + "[rail-down]"),
    "rail port": Tests(PREFLIGHT + "test_a_port_down_names_its_interface_in_the_remedy",
                       REMEDIES + "test_a_port_that_is_down_names_its_interface_in_the_remedy",
                       LAB_FAULT + "[rail-down]"),
    "rail rate": Tests(EVERY_PREFLIGHT_ROW, LAB_FAULT + "[rail-down]"),
    "rail fec": Tests(FABRIC + "test_a_200g_rail_without_fec_fails_with_the_remedy", FABRIC + "test_fec_unreadable_says_so",
                      FABRIC + "test_fec_fault_caught_with_the_remedy_then_healed"),
    "rail gid": Tests(FABRIC + "test_a_moved_gid_index_fails_naming_the_right_one",
                      FABRIC + "test_no_gid_for_the_address_or_no_table"),
    "rail mtu": Tests(SPARK_REPORT, LAB_FAULT + "[mtu]"),
    "rail address": Tests(EVERY_PREFLIGHT_ROW),
    "path mtu": Tests(PREFLIGHT + "test_path_mtu_is_one_row_per_rail_naming_the_silent_peers", LAB_FAULT + "[mtu]"),

    # ------------------------------------------------------------------------- 01 preflight: artifacts
    # "image" is also the image check before 04 and 05 (serving/inspection.py)
    "image": Tests("tests/test_image_identity.py::"
                   "test_01_passes_a_worker_holding_the_heads_image_under_another_stores_id_and_fails_another",
                   REMEDIES + "test_an_image_missing_on_a_worker_links_to_03", LAB_FAULT + "[image-drift]", NO_IMAGE),
    "model": Tests(PREFLIGHT + "test_a_model_fetched_from_the_hub_may_be_absent_before_03",
                   LAB_FAULT + "[model-drift]"),
    "model extras": Tests(PREFLIGHT + "test_a_workers_extra_model_files_are_a_warning_not_a_difference"),
    "hf token": Tests(EVERY_PREFLIGHT_ROW),  # model.needs_token, its variable unset
    # also 05's gate before the launch
    "memory fit": Tests("tests/test_memfit.py::test_a_max_model_len_too_long_names_the_length_that_fits",
                        "tests/test_memfit.py::test_05_fails_before_anything_launches_when_the_model_does_not_fit"),

    # ------------------------------------------------------------------------- 02 collectives
    "all-reduce": Tests(SWEEP_STOPPED,
                        COLLECTIVES + "test_a_rank_that_never_joins_fails_within_the_limit_and_leaves_nothing"),
    "cleanup": Tests(SWEEP_STOPPED),
    # also `sparkbook diagnose` on a pasted nccl-tests table (collectives/nccltests.py)
    "reduced values": Tests(NCCL + "test_02_judges_its_plateau_and_its_latency_against_the_pair_bars",
                            NCCL + "test_wrong_values_in_a_pasted_table_fail_the_reduced_values"),
    "bus bandwidth": Tests(NCCL + "test_the_published_pair_after_recabling_fails_with_the_remedy"),
    "small-message latency": Tests(NCCL + "test_latency_both_ways_and_reported_without_a_bar"),
    "transport": Tests(COLLECTIVES + "test_verdict_on_a_real_two_gpu_run_reads_the_transport_from_the_channels"),
    "serving image on every node": FailsAs("image ID"),  # the PASS of the copy before the sweep
    "rdma": Tests(RDMA + "test_slow_both_ways_with_clean_counters_is_the_degraded_init_rebooted_then_power_cycled",
                  RDMA + "test_down_missing_and_perftest_errors_are_not_called_slow",
                  RDMA + "test_one_nodes_cable_on_a_switch_is_named_among_four"),
    "rdma latency": Tests(RDMA + "test_every_good_link_sums_up_in_one_row_per_rail_and_slow_latency_warns"),
    "link at fault": Tests(RDMA + "test_one_nodes_cable_on_a_switch_is_named_among_four",
                           RDMA + "test_pairs_name_the_node_in_every_slow_pair",
                           RDMA + "test_pairs_name_the_one_slow_pair_and_own_up_to_no_culprit"),
    "rdma vs all-reduce": Tests(RDMA + "test_nccl_far_below_rdma_at_rate_is_nccl_not_the_cable"),
    "pair all-reduce": Tests(RDMA + "test_pairs_name_the_node_in_every_slow_pair"),

    # ------------------------------------------------------------------------- 03 distribute
    "image ID": Tests(FAILED_COPY, COLLECTIVES + "test_a_failed_image_copy_fails_02_and_the_sweep_does_not_run"),
    "layer skipping": Tests(DISTRIBUTE + "test_a_worker_on_the_containerd_store_gets_the_whole_image_and_a_warning_"
                            "that_says_why"),
    "model from the hub": Tests("tests/test_hub.py::"
                                "test_a_failed_fetch_is_a_failed_check_naming_the_head_the_command_and_the_remedy"),
    "model on the head": Tests(DISTRIBUTE + "test_no_model_on_the_head_fails_and_says_how_to_put_it_there"),
    "model files": Tests(FAILED_COPY, "tests/test_distribute_safety.py::"
                                      "test_a_stuck_worker_fails_the_model_sync_by_name_and_the_other_finishes"),
    "extra model files": Tests("tests/test_distribute_safety.py::"
                               "test_a_workers_extra_files_are_kept_and_named_in_a_warning"),
    "model copy rails": Tests("tests/test_distribute_safety.py::"
                              "test_a_rail_that_is_down_hands_its_files_to_the_first_and_03_names_it"),

    # ------------------------------------------------------------------------- 04 Ray cluster, 04-05's image checks
    "in the Ray cluster": Tests(SERVING + "test_a_subset_serves_and_a_node_outside_it_in_the_ray_cluster_fails",
                                REMEDIES + "test_ray_cluster_failures_render"),
    "GPUs in Ray": Tests(REMEDIES + "test_ray_cluster_failures_render"),
    "Ray token authentication": Tests(SERVING + "test_04_says_whether_the_images_ray_requires_its_token_and_shows_"
                                      "every_bound_address"),
    # also 05's (serving/listeners.py)
    "bound addresses": Tests(SERVING + "test_bound_addresses_fail_where_sparkbook_chose_and_warn_where_nothing_"
                             "offers_a_choice"),
    "vLLM in the image": Tests(NO_IMAGE),
    "Ray in the image": Tests(OPTIONS),
    "vllm serve options": Tests(OPTIONS, STUBBED),
    "model architecture": Tests(OPTIONS, STUBBED),

    # ------------------------------------------------------------------------- 05 serve
    "port free": Tests(SERVING + "test_node_state_reads_this_deployments_containers_fingerprints_and_images"),
    "page cache": Tests("tests/test_memfit.py::test_a_refused_drop_is_a_warning_with_the_exact_sudoers_line"),
    "endpoint ready": FailsAs("serving container", "startup progress", "startup"),  # not ready: those fail
    "served model": Tests(REMEDIES + "test_serving_failures_render"),
    "vLLM's Ray workers": Tests(SERVE_OUTCOMES),
    "configuration that ran": Tests("tests/test_ran.py::test_what_the_lab_asks_is_what_it_runs_and_a_wrapper_or_"
                                    "another_value_fails_05",
                                    "tests/test_ran.py::test_a_log_without_the_line_warns_on_the_head_only"),
    # the WARN of an API open beyond loopback without a key, and the FAIL of a key vLLM refused
    "API key": Tests(SERVE_OUTCOMES,
                     SERVING + "test_the_readiness_wait_sends_the_key_and_stops_at_once_when_it_is_refused"),
    "serving container": Tests(SERVE_OUTCOMES),
    "startup progress": Tests(SERVING + "test_a_stall_is_called_when_no_node_moves_naming_the_node_furthest_behind",
                              "tests/test_serving_lab.py::test_a_rank_that_hangs_is_called_a_stall_within_stall_timeout"),
    "startup": Tests(SERVE_OUTCOMES),
    "secrets in the containers": Tests(SERVING + "test_the_secrets_the_containers_hold_are_judged_against_the_parameters"),

    # ------------------------------------------------------------------------- 06 smoke test
    "model listed": Tests(SMOKE + "test_model_served_under_another_name_fails_the_listing"),
    "chat completion": Tests(SMOKE + "test_missing_usage_fails_the_chat_checks"),
    "streamed chat": Tests(SMOKE + "test_missing_usage_fails_the_chat_checks"),
    "reasoning": Tests(SMOKE + "test_no_reasoning_or_nothing_but_reasoning_fails",
                       SMOKE + "test_reasoning_markup_left_in_the_answer_fails"),
    "tool call (auto)": Tests(SMOKE + "test_a_parser_that_is_not_the_models_fails_the_auto_call_only",
                              SMOKE + "test_bad_tool_arguments_fail"),
    "tool call (required)": Tests(
        SMOKE + "test_without_a_tool_call_parser_auto_is_skipped_and_a_refused_required_fails",
        SMOKE + "test_bad_tool_arguments_fail"),
    "max_tokens": Tests(SMOKE + "test_ignored_max_tokens_and_stop_fail"),
    "stop": Tests(SMOKE + "test_ignored_max_tokens_and_stop_fail",
                  SMOKE + "test_a_stop_is_proved_only_against_a_reference_that_writes_it"),
    "unknown model": Tests(SMOKE + "test_unknown_model_that_hangs_fails_within_the_timeout"),
    "API key required": Tests(SMOKE + "test_the_step_sends_the_api_key_of_the_parameters"),
    "burn-in sequential": Tests("tests/test_burnin.py::test_the_sixth_request_failing_fails_the_burn_in_naming_it",
                                "tests/test_burnin.py::test_a_server_that_writes_past_max_tokens_fails"),
    "soak": Tests("tests/test_burnin.py::test_a_request_failing_during_the_soak_fails_it_naming_it"),
    "soak drift": Tests("tests/test_burnin.py::test_a_server_that_slows_as_it_runs_fails_the_drift",
                        "tests/test_burnin.py::test_drift_compares_the_medians_of_the_first_and_last_thirds_in_sending_order",
                        "tests/test_burnin.py::test_a_slowdown_that_is_large_but_not_consistent_is_a_warning",
                        "tests/test_serving_lab.py::test_a_server_throttled_halfway_through_the_soak_fails_06s_drift_and_its_health_is_timed"),
    # also 07's levels (sparkbook/serving/health.py)
    "link errors while serving": Tests(HEALTH + "test_changes_are_timed_from_the_first_sample_and_placed_in_their_level",
                                       THROTTLED),
    "gpu clocks while serving": Tests(HEALTH + "test_changes_are_timed_from_the_first_sample_and_placed_in_their_level",
                                      THROTTLED),
    "xid while serving": Tests(HEALTH + "test_a_new_xid_is_judged_by_its_code"),
    "serving health": Tests(HEALTH + "test_nothing_changed_is_one_pass_and_a_silent_node_a_warning"),
    "known answers": Tests("tests/test_known_answers.py::test_same_fingerprint_different_answers_fails_naming_prompt_"
                           "run_and_where", "tests/test_known_answers.py::test_a_request_that_fails_fails_the_row"),

    # ------------------------------------------------------------------------- 07 benchmark
    "load *": Tests(BENCH + "test_full_run_with_failures_skips_and_references"),
    "benchmark": Tests(NO_LEVEL),
    "prompt sizing": Tests(NO_LEVEL),
    "load generator": Tests(BENCH + "test_verdict_passes_a_clean_run_and_warns_on_a_busy_client"),
    "single user vs *": Tests(BENCH + "test_full_run_with_failures_skips_and_references"),
    "plausibility *": Tests("tests/test_ceiling.py::test_verdict_in_both_directions[70.0-FAIL-measurement bug]",
                            "tests/test_ceiling.py::test_verdict_in_both_directions[10.0-WARN-eager mode]"),
    "plausibility": FailsAs("plausibility *"),  # SKIP: no bandwidth set, or no config.json to judge by

    # ------------------------------------------------------------------------- 05 and 07: 01 still holds
    "* holds": Tests(EXPIRY + "test_an_expired_preflight_fails_and_one_that_failed_warns",
                     EXPIRY + "test_no_preflight_warns_and_asks_no_node"),
    "booted since": Tests(EXPIRY + "test_a_node_booted_since_fails_by_name_and_one_that_does_not_answer_warns",
                          EXPIRY + "test_an_older_verdict_without_boot_ids_warns_for_each_node"),

    # ------------------------------------------------------------------------- day two: the service
    "service": Tests(SERVICE_CHECKS),
    "service endpoint": Tests(SERVICE_CHECKS),
    "service removed": Tests(SERVICE_CHECKS),
    "upgrade steps": Tests(UPGRADE + "test_a_failed_step_another_answer_or_a_slower_candidate_fails_the_gate_by_name"),
    "upgrade known answers": Tests(UPGRADE + "test_a_failed_step_another_answer_or_a_slower_candidate_fails_the_gate_by_name"),
    "upgrade *": Tests(UPGRADE + "test_a_failed_step_another_answer_or_a_slower_candidate_fails_the_gate_by_name",
                       UPGRADE + "test_a_baseline_without_07_fails_the_numbers_it_cannot_compare"),
    "upgrade": Tests("tests/test_upgrade_lab.py::test_a_good_candidate_is_promoted_and_a_wrapped_one_rolled_back_by_itself"),

    # ------------------------------------------------------------------------- 08 teardown ("reachable": 00)
    "containers removed": Tests(REMEDIES + "test_teardown_failures_render"),
    "ports released": Tests(REMEDIES + "test_teardown_failures_render"),
}

# Rows whose name the source passes as a variable, by (file under sparkbook/, variable): the names
# it takes, read by hand.
BY_VARIABLE = {
    ("bench/ceiling.py", "name"): ("plausibility *",),         # _judge: f"plausibility {lv.label}"
    ("bench/checks.py", "name"): ("single user vs *",),        # checks: f"single user vs {ref.label}"
    ("distribution/hub.py", "CHECK"): ("model from the hub",),
    ("smoke/known_answers.py", "CHECK"): ("known answers",),
    ("preflight/host.py", "what"): ("driver", "firmware"),     # versions, in_range: ("driver", "firmware")
    ("preflight/nodes.py", "what"): ("model disk", "docker disk"),  # disks
    ("setup/fabric.py", "what"): ("fabric apply", "fabric restore", "ssh mesh", "ssh mesh restore"),  # cli's fabric
    ("serving/health.py", "name"): ("link errors while serving", "gpu clocks while serving", "xid while serving"),
    ("smoke/api.py", "name"): (),  # _Smoke.check: the name its callers give, found as s.check(...) calls
}


@dataclass
class Row:
    """A row found in the source: its name (``*`` for each f-string field), where, the call."""

    name: str
    where: str
    call: ast.Call


def template(node: ast.expr) -> str | None:
    """A str constant's text, or an f-string's with ``*`` for each field; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
    return None


def callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def is_smoke(call: ast.Call) -> bool:
    """A method ``check`` of four positional arguments, the first a str: smoke/api.py's
    ``s.check(name, command, expected, fn)``."""
    return callee(call) == "check" and len(call.args) == 4 and template(call.args[0]) is not None


def is_check(call: ast.Call) -> bool:
    return callee(call) == "Check" or is_smoke(call)


def scan_source(text: str, file: str) -> tuple[list[Row], list[str]]:
    """The rows of one module (``file``: its path under sparkbook/), and the problems: a row named
    by a variable that :data:`BY_VARIABLE` does not list."""
    rows, problems = [], []
    for call in ast.walk(ast.parse(text)):
        if not (isinstance(call, ast.Call) and is_check(call)):
            continue
        where = f"sparkbook/{file}:{call.lineno}"
        first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "check"), None)
        if first is None:  # Check(**saved): a verdict read back (Verdict.from_json)
            continue
        name = template(first)
        if name is not None:
            rows.append(Row(name, where, call))
        elif isinstance(first, ast.Name) and (file, first.id) in BY_VARIABLE:
            rows += [Row(n, where, call) for n in BY_VARIABLE[(file, first.id)]]
        else:
            problems.append(f"{where}: a row named by {ast.unparse(first)}: list the names it takes in "
                            "BY_VARIABLE (tests/check_rows.py)")
    return rows, problems


def scan() -> tuple[list[Row], list[str]]:
    """Every row in sparkbook/**/*.py, and the problems of :func:`scan_source`."""
    rows, problems = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        r, p = scan_source(path.read_text(), path.relative_to(PACKAGE).as_posix())
        rows, problems = rows + r, problems + p
    return rows, problems


def argument(call: ast.Call, index: int, name: str) -> ast.expr | None:
    """A ``Check(...)`` call's argument by position or keyword."""
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == name), None)


def statuses(call: ast.Call) -> set[str]:
    """The names the status argument of a ``Check(...)`` call is made of (``PASS if ok else FAIL``:
    PASS, FAIL, ok); empty for an ``s.check(...)``, whose status its function returns."""
    if is_smoke(call):
        return set()
    arg = argument(call, 2, "status")
    return {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)} if arg is not None else set()


def expected_text(call: ast.Call) -> str:
    """The literal text of a ``Check(...)`` call's expected argument (an f-string's fields left out)."""
    arg = call.args[2] if is_smoke(call) else argument(call, 4, "expected")
    return (template(arg) or "") if arg is not None else ""


# ---------------------------------------------------------------------------- the recorder

def matches(name: str, row: str) -> bool:
    """Whether a check named ``name`` is the row ``row`` (``*`` matching anything)."""
    return re.fullmatch(".*".join(map(re.escape, row.split("*"))), name, re.S) is not None


def rows_naming(test_id: str, case: str) -> list[str]:
    """The rows whose tests name the test ``test_id`` (``tests/test_x.py::test_name``) or its
    parametrized ``case`` (``test_id[case]``)."""
    ids = {test_id, f"{test_id}[{case}]"}
    return [row for row, entry in ROWS.items() if isinstance(entry, Tests) and ids & set(entry)]


def record(monkeypatch) -> list:
    """The checks the package creates from now on (not those a test writes itself), as the test
    runs: ``Check.__post_init__`` wrapped."""
    from sparkbook.book import verdict
    seen: list = []
    original = verdict.Check.__post_init__

    def recorded(self) -> None:
        original(self)
        caller = sys._getframe(2).f_code.co_filename  # 0: here, 1: the dataclass's __init__
        if Path(caller).is_relative_to(PACKAGE):
            seen.append(self)

    monkeypatch.setattr(verdict.Check, "__post_init__", recorded)
    return seen


def unproved(rows: list[str], checks: list) -> list[str]:
    """The ``rows`` no check among ``checks`` made FAIL or WARN."""
    return [row for row in rows if not any(c.status in ("FAIL", "WARN") and matches(c.check, row) for c in checks)]
