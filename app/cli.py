"""Command line: serve the extender, show the GPU catalog, run the embedded demo, explain a pod."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.calibration.command import calibrate
from app.config.settings import ConfigDeprecationWarning, ConfigError, Settings, load_settings

cli = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="llm-placement: LLM-lifecycle-aware scheduler extender for kube-scheduler.")
console = Console()
GIL_SWITCH_INTERVAL_SECONDS = 0.0005
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML settings file (env LLMP_CONFIG).")
]


def _load_warning_each(config: Path | None, **overrides: Any) -> Settings:
    """load_settings, each deprecation printed once as one ``warning:`` line on standard error (not
    Python's warning format, which points into pydantic's frames)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigDeprecationWarning)
        try:
            return load_settings(config, **overrides)
        finally:
            err = Console(stderr=True)
            for message in dict.fromkeys(str(w.message) for w in caught
                                         if issubclass(w.category, ConfigDeprecationWarning)):
                err.print(f"[yellow]warning: {escape(message)}[/yellow]", soft_wrap=True, highlight=False)
            for w in caught:
                if not issubclass(w.category, ConfigDeprecationWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _settings(config: Path | None, **overrides: Any) -> Settings:
    try:
        return _load_warning_each(config, **{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as exc:
        # One line whatever the terminal width (soft_wrap), and a message quoting a value such as
        # "[serving]" is printed as it is, not read as console markup.
        console.print(f"[red]{escape(' '.join(str(exc).split()))}[/red]", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None


@cli.command()
def serve(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option(help="Listen address for the extender verbs.")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port for the extender verbs.")] = None,
    kubeconfig: Annotated[str | None, typer.Option(
        help="Kubeconfig file (else LLMP_KUBECONFIG, KUBECONFIG, ~/.kube/config, in-cluster).")] = None,
) -> None:
    """Run the extender (filter / prioritize / bind / preempt) for kube-scheduler."""
    import uvicorn

    from app.api.app import create_app
    from app.api.server import HttpLimits, start_metrics_server, uvicorn_options
    from app.extender.wiring import build_live

    settings = _settings(config, host=host, port=port, kubeconfig=kubeconfig)
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Bind, watch and metrics threads share the GIL with the event loop that answers filter calls.
    # With the default 5 ms switch interval a filter request can wait a full interval per handoff
    # behind a bind thread; 0.5 ms keeps kube-scheduler's synchronous path short. Not a setting:
    # nothing an operator knows about the cluster changes the right value.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_SECONDS)
    # Our own one-line warnings say what failed; urllib3's per-retry lines only multiply them.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    try:
        service, cache = build_live(settings)
    except Exception as exc:
        _fail_start(exc, settings.kubeconfig)
    if settings.metrics_port:
        # Loopback unless metrics_host says otherwise (the chart sets 0.0.0.0 so Prometheus can
        # scrape the pod); the verbs stay on ``host``.
        try:
            start_metrics_server(settings.metrics_port, settings.metrics_host, service.metrics.registry,
                                 HttpLimits.from_settings(settings))
        except OSError as exc:
            console.print(f"[red]cannot listen for metrics on {settings.metrics_host}:{settings.metrics_port}"
                          f": {exc.strerror}; set metrics_port (0 turns metrics off) or free the port[/red]",
                          soft_wrap=True, highlight=False)
            raise typer.Exit(2) from None
    if cache is not None:
        cache.start()
    from app.api.access import KubernetesAccess, OpenAccess
    from app.cluster.binder import Binder

    binder = service.binder
    open_explain = settings.explain_auth == "none" or not isinstance(binder, Binder)
    access = OpenAccess() if open_explain else KubernetesAccess(binder.rest)  # type: ignore[union-attr]
    # Idle, slow and oversized requests are cut off (docs/extender-protocol.md, "Connection limits").
    uvicorn.run(create_app(service, access), **uvicorn_options(settings))


def _fail_start(exc: Exception, kubeconfig: str | None) -> NoReturn:
    """Start-up failed: say what and what to do in one or two lines, no traceback."""
    from app.cluster.client import CredentialsError

    text = escape(" ".join(str(exc).split())[:400])
    if isinstance(exc, CredentialsError):
        console.print(f"[red]{text}[/red]", soft_wrap=True, markup=True, highlight=False)
    else:
        console.print(f"[red]cannot start: {type(exc).__name__}: {text}[/red]", soft_wrap=True,
                      highlight=False)
        console.print("check that the API server in your kubeconfig is reachable and these credentials "
                      "may list pods and nodes (helm/llm-placement/files/extender-rbac-rules.yaml)",
                      soft_wrap=True, highlight=False)
    raise typer.Exit(1)


@cli.command()
def catalog(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Show the built-in GPU catalog."""
    from app.base.catalog import GpuCatalog

    cat = GpuCatalog.load()
    if as_json:
        print(json.dumps([e.model_dump(mode="json") for e in cat.entries], indent=2))
        return
    table = Table(title="GPU catalog (per GPU)")
    for col in ("GPU", "memory GB", "HBM TB/s", "BF16 TFLOPS", "INT8 TOPS", "interconnect", "$/GPU-h"):
        table.add_column(col, justify="left" if col in ("GPU", "interconnect") else "right")
    for e in sorted(cat.entries, key=lambda e: -e.hbm_bandwidth_tbs):
        table.add_row(e.name, f"{e.memory_gb:g}", f"{e.hbm_bandwidth_tbs:g}", f"{e.bf16_tflops:g}",
                      f"{e.int8_tops:g}" if e.int8_tops else "-", e.interconnect,
                      f"{e.hourly_cost_usd:.2f}" if e.hourly_cost_usd else "-")
    console.print(table)


@cli.command()
def models(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Show the model registry: the names the `model` annotation accepts and their architecture."""
    from app.base.model_registry import default_registry

    reg = default_registry()
    if as_json:
        print(json.dumps([e.model_dump(mode="json") for e in reg], indent=2))
        return
    table = Table(title="Model registry (KV cache per token at 16 bits)")
    for col in ("model", "params", "active", "layers", "KV heads x dim", "KV kB/token", "experts"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for e in reg:
        kv = f"MLA {e.mla.kv_lora_rank}+{e.mla.qk_rope_head_dim}" if e.mla else f"{e.kv_heads} x {e.head_dim}"
        experts = f"{e.moe.top_k} of {e.moe.experts}" if e.moe else ""
        table.add_row(e.name, f"{e.params / 1e9:g}B",
                      f"{e.active_params / 1e9:g}B" if e.active_params else "", str(e.layers), kv,
                      f"{e.kv_bytes_per_token() / 1e3:.0f}", experts)
    console.print(table)


@cli.command()
def demo(
    config: ConfigOpt = None,
    cluster: Annotated[Path | None, typer.Option(help="Cluster YAML (default: the embedded one).")] = None,
    workload: Annotated[Path | None, typer.Option(help="Workload YAML (default: the embedded one).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    profiles: Annotated[Path | None, typer.Option(
        help="Measured profiles file (default: the settings' profiles_file, else the bundled "
             "example app/demo/profiles.yaml, illustrative figures).")] = None,
) -> None:
    """Place the embedded workload (all five stages) on the embedded mixed cluster and say why."""
    from app.demo.run import EXAMPLE_PROFILES, demo_header, notes, run_demo

    # --profiles wins over the settings' profiles_file; the example fills in only when neither names one.
    settings = _settings(config, profiles_file=str(profiles) if profiles else None)
    try:
        service, placements = run_demo(settings, cluster, workload, profiles=EXAMPLE_PROFILES)
    except (OSError, ValueError) as exc:  # a user's cluster or workload file: one line, no traceback
        Console(stderr=True).print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps([{"pod": p.pod, "stage": p.stage, "node": p.node, "reason": p.reason,
                           "precision": p.precision, "ms_per_token": p.ms_per_token,
                           "ms_per_token_source": p.fit.ms_source if p.fit else None,
                           "notes": notes(p), "terms": dict(p.terms)} for p in placements], indent=2))
        return
    console.print(demo_header())
    table = Table(title="llm-placement demo (what-if): where each pod goes and why")
    # One namespace (the embedded workload's): name it once so pod names fit an 80-column terminal.
    namespaces = {p.pod.partition("/")[0] for p in placements}
    short = len(namespaces) == 1
    if short:
        table.caption = f"namespace {next(iter(namespaces))}"
    table.add_column("pod", no_wrap=True)
    for col in ("stage", "node", "hardware", "why"):
        table.add_column(col)
    for p in placements:
        name = p.pod.partition("/")[2] if short else p.pod
        if p.node is None:
            table.add_row(name, p.stage or "-", "[red]pending[/red]", "", p.reason)
            continue
        facts = service.snapshot.nodes[p.node]
        hw = facts.gpu.name if facts.gpu else facts.node_class.value
        why = notes(p)
        if p.precision and p.score and p.score.terms.get("precision", 1) < 1:
            why.append(f"runs at {p.precision}")
        why += [f"{t} {v:.2f}" for t, v in p.terms]
        table.add_row(name, p.stage or "-", p.node, hw, ", ".join(why))
    console.print(table)
    placed = sum(1 for p in placements if p.node)
    console.print(f"{placed}/{len(placements)} pods placed on {len(service.snapshot.nodes)} nodes.")


@cli.command()
def explain(
    pod: Annotated[str, typer.Argument(help="namespace/name")],
    url: Annotated[str, typer.Option(help="Extender base URL.")] = "http://127.0.0.1:8888",
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    token: Annotated[str | None, typer.Option(
        envvar="LLMP_EXPLAIN_TOKEN",
        help="Bearer token of someone who may get the pod (e.g. $(kubectl create token NAME)).")] = None,
    ca_file: Annotated[str | None, typer.Option(
        envvar="LLMP_EXPLAIN_CA_FILE",
        help="CA of the extender's serving certificate, for an https URL (docs/security.md).")] = None,
) -> None:
    """Explain why a pod went where it did (or why it waits), from a running extender."""
    import ssl

    import httpx

    ns, _, name = pod.partition("/")
    if not name:
        console.print("[red]give the pod as namespace/name[/red]")
        raise typer.Exit(2)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        resp = httpx.get(f"{url.rstrip('/')}/explain/{ns}/{name}", headers=headers, timeout=10,
                         verify=verify)
    except (httpx.HTTPError, OSError) as exc:
        console.print(f"[red]cannot reach the extender at {url}: {exc}[/red]")
        raise typer.Exit(1) from None
    if resp.status_code != 200:
        console.print(f"[red]{resp.status_code}: {resp.text}[/red]")
        raise typer.Exit(1)
    data = resp.json()
    if as_json:
        print(json.dumps(data, indent=2))
        return
    render_explain(data)


def render_explain(data: dict[str, Any]) -> None:
    console.print(f"[bold]{data['pod']}[/bold]  stage={data.get('stage')}  gpus={data.get('gpus')}")
    console.print(f"[bold]{data['summary']}[/bold]")
    for line in data.get("serving_targets") or ():
        color = "yellow" if line.startswith("misses") else "green"
        console.print(f"[{color}]engine: {escape(line)}[/{color}]", highlight=False)
    gravity = data.get("gravity")
    if gravity:
        for edge in gravity.get("edges", []):
            where = ", ".join(f"{s['node']} ({s['state']})" for s in edge.get("sites", [])) or "not found"
            console.print(f"depends on [bold]{edge['producer']}[/bold] ({edge['gb']} GB): {where}")
        for note in gravity.get("notes", []):
            console.print(f"[yellow]{note}[/yellow]")
    chosen = next((e for e in data.get("nodes", []) if e["node"] == data.get("chosen")), None)
    if chosen and chosen.get("memory_breakdown"):
        parts = " + ".join(f"{k} {v:g}" for k, v in chosen["memory_breakdown"].items() if v)
        console.print(f"memory on {chosen['node']}: {chosen['per_gpu_gb']:g} GB per GPU = {parts}")
    table = Table()
    for col in ("node", "feasible", "score", "detail"):
        table.add_column(col)
    rows = sorted(data.get("nodes", []), key=lambda e: (not e["feasible"], -e.get("score", 0), e["node"]))
    for e in rows:
        if e["feasible"]:
            terms = ", ".join(f"{k} {v:.2f}" for k, v in e["terms"].items() if e["weights"].get(k))
            if g := e.get("gravity"):
                dist = "/".join(sorted({x["distance"] for x in g.get("edges", [])}))
                terms += f"; data {dist}, {g['seconds']:.1f} s transfer"
            table.add_row(e["node"], "[green]yes[/green]", str(e["score"]), terms)
        else:
            table.add_row(e["node"], "[red]no[/red]", "", e["reason"])
    console.print(table)


@cli.command()
def plan(
    workflow: Annotated[Path | None, typer.Argument(help="Workflow YAML (default: the bundled one).")] = None,
    cluster: Annotated[Path | None, typer.Option(help="Cluster YAML (default: the embedded one).")] = None,
    live: Annotated[bool, typer.Option("--live", help="Plan on the live cluster's nodes.")] = False,
    kubeconfig: Annotated[str | None, typer.Option(help="With --live (default: $KUBECONFIG).")] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.1, help="Solver seconds.")] = 10.0,
    secondary: Annotated[str, typer.Option(help="After makespan: cost, transfer or none.")] = "cost",
    gantt: Annotated[Path | None, typer.Option(help="Write a Gantt chart PNG.")] = None,
    annotations: Annotated[Path | None, typer.Option(help="Write the plan as pod YAML.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Plan a whole workflow ahead: makespan-optimal placement, against HEFT and our extender."""
    import sys
    import time

    from app.plan.cluster import load_cluster
    from app.plan.files import fail_line, process_age
    from app.plan.workflow import load_workflow

    # The time limit counts from the command's start: interpreter, files, model and report (from
    # this call when the process was started for something else, such as a test runner).
    started = time.perf_counter() - (process_age() if "plan" in sys.argv[1:] else 0.0)
    # Files that cannot be used (an alias bomb, too large, too many entries, an unknown field) are
    # refused before the solver and its libraries are loaded: in a fraction of a second and the
    # memory of a bare start.
    try:
        if live and cluster is not None:
            raise ValueError("give --cluster or --live, not both")
        wf = load_workflow(workflow)
        cf = None if live else load_cluster(cluster)
    except ValueError as exc:
        fail_line(str(exc))
        raise typer.Exit(2) from None
    from app.plan.cli import run_plan_command

    run_plan_command(console, _settings(config), workflow=wf, cluster=cf, live=live,
                     kubeconfig=kubeconfig, time_limit=time_limit, secondary=secondary, gantt=gantt,
                     annotations=annotations, as_json=as_json, started=started)


cli.command("calibrate")(calibrate)

config_cli = typer.Typer(no_args_is_help=True, help="The settings file (README, \"Settings\").")
cli.add_typer(config_cli, name="config")


@config_cli.command("validate")
def config_validate(
    file: Annotated[Path, typer.Argument(help="YAML settings file, read as `serve --config FILE` reads it.")],
) -> None:
    """Check a settings file: one line per bad field, with its path; exit status 2 on any.
    Deprecated forms (no apiVersion, an old name) pass with a warning on standard error."""
    try:
        _load_warning_each(file)
    except ConfigError as exc:
        for problem in exc.problems:
            typer.echo(" ".join(problem.split()))  # one line each, whatever the message
        raise typer.Exit(2) from None
    typer.echo(f"{file}: OK")


@config_cli.command("dump")
def config_dump(
    file: Annotated[Path | None, typer.Argument(
        help="YAML settings file (default: LLMP_CONFIG), read as `serve --config FILE` reads it.")] = None,
    all_settings: Annotated[bool, typer.Option(
        "--all", help="Every setting, defaults included (default: only those that differ).")] = False,
) -> None:
    """Print the settings in the current versioned form: an unversioned file or old names, rewritten."""
    from app.config.settings import dump_settings

    typer.echo(dump_settings(_settings(file), changed_only=not all_settings), nl=False)


@config_cli.command("docs")
def config_docs() -> None:
    """Print the reference of every setting (docs/configuration.md), generated from the model."""
    from app.config.docs import markdown

    typer.echo(markdown(), nl=False)

profiles_cli = typer.Typer(no_args_is_help=True, help="Measured serving profiles (docs/stage-policy.md).")
cli.add_typer(profiles_cli, name="profiles")


@profiles_cli.command("import")
def profiles_import(
    files: Annotated[list[Path], typer.Argument(
        help="Result files: vLLM benchmark_serving --save-result JSON, SGLang bench_serving JSONL.")],
    model_params: Annotated[str, typer.Option(help="Parameter count of the model, e.g. 8B.")],
    gpu: Annotated[str, typer.Option(help="GPU product it ran on (catalog name or alias, e.g. L4).")],
    precision: Annotated[str, typer.Option(help="Weights precision: fp32, bf16, fp16, fp8, int8, int4.")],
    model: Annotated[str | None, typer.Option(
        help="Name for explain (default: the file's model_id).")] = None,
    active_params: Annotated[str | None, typer.Option(help="Mixture of experts: active parameters.")] = None,
    gpus: Annotated[int, typer.Option(min=1, help="GPUs per serving pod (tensor parallel size).")] = 1,
    statistic: Annotated[str, typer.Option(
        help="median (default), mean or p99 of TPOT and TTFT.")] = "median",
    concurrency: Annotated[int | None, typer.Option(
        help="Keep the run at this max_concurrency (default: the highest).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Write to this profiles file, replacing an entry for the same model, GPU, count and "
             "precision (default: print YAML).")] = None,
) -> None:
    """Turn serving-benchmark results into a measured-profile entry (YAML on stdout or --out)."""
    import yaml

    from app.base.catalog import GpuCatalog
    from app.base.workload import Precision
    from app.serving.profiles_import import (
        BenchmarkImportError,
        Statistic,
        build_profile,
        choose,
        load_existing,
        merge,
        read_runs,
        to_document,
    )

    err = Console(stderr=True)
    try:
        try:
            stat, prec = Statistic(statistic.lower()), Precision(precision.lower())
        except ValueError as exc:
            raise BenchmarkImportError(str(exc)) from None
        runs = [run for f in files for run in read_runs(f, stat)]
        profile = build_profile(choose(runs, concurrency), model=model, model_params=model_params,
                                active_params=active_params, gpu=gpu, gpus=gpus, precision=prec,
                                stat=stat, catalog=GpuCatalog.load())
        entries = merge(load_existing(out), profile) if out else [profile]
    except BenchmarkImportError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    text = yaml.safe_dump(to_document(entries), sort_keys=False, width=1000)
    if out is None:
        print(text, end="")
        return
    out.write_text(text, encoding="utf-8")
    err.print(f"wrote {len(entries)} profile(s) to {out}", highlight=False)


def main() -> None:
    try:
        cli()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
