// epd_k8s_check.mjs — checks rendered Kubernetes manifests of deploy/k8s
// offline (tests/deploy/test_k8s_manifests.sh runs it on every overlay).
//
//   node epd_k8s_check.mjs NODE_MODULES BIN_DIR PROM_DIR OVERLAY=RENDERED.yaml...
//
// 1. Schemas: every object against its kind's JSON schema — the built-in
//    kinds with the npm package kubernetes-models, KEDA's ScaledObject with
//    @kubernetes-models/keda (generated from KEDA's CRD).  Those schemas let
//    unknown fields through, so every field is also looked up in the
//    packages' type declarations (.d.ts): a misspelt or misplaced field
//    (`livenesProbe`, `ports` under `resources`) is an error.
// 2. Cross-references:
//    - every flag a container passes exists in that binary's --help (the
//      daemons of BIN_DIR; epd-ctl's preStop command too); all unknown
//      flags are listed at once, by binary;
//    - every $(VAR) in args is an env var of the container; the worker id
//      is the pod's name (else every pod would be ROLE-1);
//    - scraping: each daemon's pod template has prometheus.io/scrape,
//      port and path annotations for its /metrics (the router's --listen
//      port, a worker's --metrics-addr port, named containerPort metrics);
//    - probe ports: the router's HTTP probes (/health liveness, /ready
//      readiness) hit the port of --listen, workers' gRPC probes and the
//      preStop drain the port of --control-addr; named ports exist;
//    - Services select exactly one Deployment's pods and target ports it
//      has; the workers' --router HOST:PORT is a Service with that port that
//      publishes not-ready addresses (the router is ready only after
//      workers registered);
//    - Deployment selectors are disjoint (no selector matches another
//      Deployment's pods); each pool has a PodDisruptionBudget selecting it
//      and only it;
//    - Secrets: volumes name Secrets that exist, mode 0400 or 0600; the
//      --cluster-secret-file / --api-key-file paths lie in such a mount
//      and name a key of the Secret;
//    - terminationGracePeriodSeconds exceeds --drain-grace-ms plus the
//      preStop wait (--wait-ms);
//    - autoscalers: each scales an existing Deployment, none is scaled
//      twice, HPA external metrics are served by the adapter's rules
//      (PROM_DIR/adapter-rules.yaml), which read series recorded by
//      PROM_DIR/rules.yaml, and every KEDA query is tested verbatim in
//      PROM_DIR/rules_test.yaml (promtool runs those tests).
import { readFileSync, existsSync } from "node:fs";
import { join, dirname, resolve } from "node:path";
import { createRequire } from "node:module";
import { execFileSync } from "node:child_process";
import { pathToFileURL } from "node:url";

// --compare NODE_MODULES A.yaml B.yaml: the same objects, field for field
// (order of objects and keys aside; a Secret's base64 may wrap lines)
if (process.argv[2] === "--compare") {
  const req = createRequire(join(resolve(process.argv[3]), "x.js"));
  const Y = req("yaml");
  const canon = (v) =>
    Array.isArray(v) ? v.map(canon)
    : v && typeof v === "object" ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canon(v[k])]))
    : v;
  const load = (f) => {
    const m = new Map();
    for (const d of Y.parseAllDocuments(readFileSync(f, "utf8"), { version: "1.1" })) {
      const o = d.toJS();
      if (!o) continue;
      if (o.kind === "Secret") for (const k of Object.keys(o.data ?? {})) o.data[k] = o.data[k].replace(/\s+/g, "");
      m.set(`${o.kind}/${o.metadata?.namespace ?? ""}/${o.metadata?.name}`, JSON.stringify(canon(o)));
    }
    return m;
  };
  const a = load(process.argv[4]), b = load(process.argv[5]);
  let diffs = 0;
  for (const k of new Set([...a.keys(), ...b.keys()])) {
    if (a.get(k) === b.get(k)) continue;
    diffs++;
    console.error(`differs: ${k}\n  ${process.argv[4]}: ${a.get(k) ?? "(absent)"}\n  ${process.argv[5]}: ${b.get(k) ?? "(absent)"}`);
  }
  process.exit(diffs ? 1 : 0);
}

const [nodeModulesArg, binDir, promDir, ...overlayArgs] = process.argv.slice(2);
if (!nodeModulesArg || !binDir || !promDir || overlayArgs.length === 0) {
  console.error("usage: node epd_k8s_check.mjs NODE_MODULES BIN_DIR PROM_DIR OVERLAY=FILE...");
  process.exit(2);
}
const nodeModules = resolve(nodeModulesArg);
const require = createRequire(join(nodeModules, "x.js"));
const YAML = require("yaml");

const errors = [];
const err = (overlay, msg) => errors.push(`${overlay}: ${msg}`);
const loadYaml = (f) =>
  YAML.parseAllDocuments(readFileSync(f, "utf8"), { version: "1.1" })
    .map((d) => d.toJS())
    .filter((v) => v !== null && v !== undefined);

// ---------------------------------------------------------------- schemas

function modelFile(o) {
  const [group, version] = o.apiVersion.includes("/") ? o.apiVersion.split("/") : ["", o.apiVersion];
  if (group === "keda.sh") return join(nodeModules, "@kubernetes-models/keda/keda.sh", version, o.kind + ".js");
  return join(nodeModules, "kubernetes-models", group, version, o.kind + ".js");
}

// .d.ts: the first interface of a module, its properties and their types
const dtsCache = new Map();
function resolveModule(spec, fromFile) {
  let p = spec.startsWith(".") ? join(dirname(fromFile), spec) : join(nodeModules, spec);
  p = p.replace(/\.js$/, "");
  return p + ".d.ts";
}
function dtsInterface(file) {
  if (dtsCache.has(file)) return dtsCache.get(file);
  const text = readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/import \{ ([^}]+) \} from "([^"]+)";/g)) {
    for (const name of m[1].split(",").map((s) => s.trim())) imports.set(name, resolveModule(m[2], file));
  }
  const start = text.search(/export interface \w+[^{]*\{/);
  let iface = null;
  if (start >= 0) {
    iface = new Map();
    const body = text.slice(text.indexOf("{", start) + 1);
    let depth = 0;
    const lines = body.split("\n");
    for (let li = 0; li < lines.length; li++) {
      const line = lines[li];
      if (depth === 0 && /^\}/.test(line)) break;
      const m = /^ {4}"([^"]+)"\??: (.+?);?$/.exec(line);
      if (m && depth === 0) {
        let type = m[2];
        // an inline map type spans lines: "labels"?: {\n [key: string]: T;\n };
        for (let lj = li + 1; type.endsWith("{") && lj < lines.length && !/^ {4}\}/.test(lines[lj]); lj++) {
          type += " " + lines[lj].trim();
        }
        const ref = [...type.matchAll(/\b(I[A-Z]\w+)\b/g)].map((x) => x[1]).find((n) => imports.has(n));
        iface.set(m[1], {
          file: ref ? imports.get(ref) : null,
          array: /^Array</.test(type),
          map: /^\{ *\[key: string\]/.test(type),
        });
      }
      depth += (line.match(/\{/g) ?? []).length - (line.match(/\}/g) ?? []).length;
    }
  }
  dtsCache.set(file, iface);
  return iface;
}
function unknownFields(value, file, path, out) {
  if (value === null || typeof value !== "object" || !existsSync(file)) return;
  const iface = dtsInterface(file);
  if (!iface) return; // a type alias (IntOrString, Quantity...): a leaf
  for (const [k, v] of Object.entries(value)) {
    const p = iface.get(k);
    if (!p) {
      out.push(`${path}.${k}: no such field`);
      continue;
    }
    if (!p.file) continue;
    if (p.array && Array.isArray(v)) v.forEach((x, i) => unknownFields(x, p.file, `${path}.${k}[${i}]`, out));
    else if (p.map && v && typeof v === "object")
      for (const [mk, mv] of Object.entries(v)) unknownFields(mv, p.file, `${path}.${k}.${mk}`, out);
    else unknownFields(v, p.file, `${path}.${k}`, out);
  }
}

async function checkSchema(overlay, o) {
  const id = `${o.kind}/${o.metadata?.name}`;
  const f = modelFile(o);
  if (!existsSync(f)) return err(overlay, `${id}: no schema for ${o.apiVersion} ${o.kind}`);
  const mod = await import(pathToFileURL(f).href);
  const Model = mod[o.kind];
  try {
    new Model(o).validate();
  } catch (e) {
    err(overlay, `${id}: schema: ${e.message}`);
  }
  const out = [];
  unknownFields(o, f.replace(/\.js$/, ".d.ts"), id, out);
  for (const u of out) err(overlay, u);
}

// ------------------------------------------------------------ --help flags

const helpCache = new Map();
function flagsOf(binary, sub) {
  const key = binary + (sub ? " " + sub : "");
  if (helpCache.has(key)) return helpCache.get(key);
  const path = join(binDir, binary);
  let text = "";
  try {
    text = execFileSync(path, sub ? [sub, "127.0.0.1:1", "--help"] : ["--help"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    text = (e.stdout ?? "") + (e.stderr ?? "");
  }
  const flags = new Set([...text.matchAll(/^\s+--([a-z0-9-]+)/gm)].map((m) => m[1]));
  if (flags.size === 0) throw new Error(`${path} --help listed no flags`);
  helpCache.set(key, flags);
  return flags;
}
const unknownFlags = new Map(); // "binary" -> Set of "--flag (overlay Deployment/container)"

function flagArgs(args) {
  const m = new Map();
  for (const a of args ?? []) {
    const x = /^--([a-z0-9-]+)(?:=(.*))?$/.exec(a);
    if (x) m.set(x[1], x[2] ?? "");
  }
  return m;
}

// --------------------------------------------------------------- helpers

const matches = (sel, labels) => Object.entries(sel ?? {}).every(([k, v]) => labels?.[k] === v);
const portOf = (addr) => Number(/:(\d+)$/.exec(addr ?? "")?.[1]);
const hostOf = (addr) => /^(.*):\d+$/.exec(addr ?? "")?.[1];

function containerPort(c, port) {
  if (typeof port === "number") return port;
  return (c.ports ?? []).find((p) => p.name === port)?.containerPort;
}

// ------------------------------------------------------------------ main

const rules = loadYaml(join(promDir, "rules.yaml"))[0];
const recorded = new Set(rules.groups.flatMap((g) => g.rules.map((r) => r.record).filter(Boolean)));
const adapter = loadYaml(join(promDir, "adapter-rules.yaml"))[0];
const adapterNames = new Map(
  adapter.externalRules.map((r) => [r.name.as, /^([a-zA-Z_:][\w:]*)/.exec(r.seriesQuery)[1]]),
);
const ruleTests = loadYaml(join(promDir, "rules_test.yaml"))[0];
const testedExprs = new Set(ruleTests.tests.flatMap((t) => (t.promql_expr_test ?? []).map((x) => x.expr)));
for (const [name, series] of adapterNames) {
  if (!recorded.has(series)) err("adapter-rules.yaml", `${name} reads ${series}, which rules.yaml does not record`);
}

const summary = [];
for (const arg of overlayArgs) {
  const [overlay, file] = arg.split("=");
  const objs = loadYaml(file);
  for (const o of objs) await checkSchema(overlay, o);

  const deps = objs.filter((o) => o.kind === "Deployment");
  const services = objs.filter((o) => o.kind === "Service");
  const secrets = new Map(objs.filter((o) => o.kind === "Secret").map((o) => [o.metadata.name, o]));
  const pdbs = objs.filter((o) => o.kind === "PodDisruptionBudget");
  const scalers = [];

  for (const d of deps) {
    const id = `Deployment/${d.metadata.name}`;
    const pod = d.spec.template.spec;
    const labels = d.spec.template.metadata.labels;
    if (!matches(d.spec.selector.matchLabels, labels)) err(overlay, `${id}: its selector does not match its pods`);
    for (const other of deps) {
      if (other !== d && matches(d.spec.selector.matchLabels, other.spec.template.metadata.labels))
        err(overlay, `${id}: its selector also matches the pods of Deployment/${other.metadata.name}`);
    }
    const covering = pdbs.filter((p) => matches(p.spec.selector.matchLabels, labels));
    if (covering.length !== 1) err(overlay, `${id}: ${covering.length} PodDisruptionBudgets select its pods (want 1)`);
    const vols = new Map((pod.volumes ?? []).map((v) => [v.name, v]));
    for (const v of pod.volumes ?? []) {
      if (!v.secret) continue;
      if (!secrets.has(v.secret.secretName)) err(overlay, `${id}: volume ${v.name}: no Secret ${v.secret.secretName}`);
      if (![0o400, 0o600].includes(v.secret.defaultMode))
        err(overlay, `${id}: volume ${v.name}: defaultMode ${v.secret.defaultMode?.toString(8)} (want 0400 or 0600)`);
    }
    for (const c of pod.containers) {
      const cid = `${id}/${c.name}`;
      const binary = (c.command?.[0] ?? "").split("/").pop();
      if (!binary.startsWith("epd-")) {
        err(overlay, `${cid}: command ${JSON.stringify(c.command)} is not an epd daemon`);
        continue;
      }
      const known = flagsOf(binary);
      const fl = flagArgs(c.args);
      for (const f of fl.keys()) {
        if (!known.has(f)) {
          if (!unknownFlags.has(binary)) unknownFlags.set(binary, new Set());
          unknownFlags.get(binary).add(`--${f}`);
        }
      }
      const envNames = new Set((c.env ?? []).map((e) => e.name));
      for (const a of c.args ?? []) {
        for (const m of a.matchAll(/\$\(([A-Za-z_]\w*)\)/g)) {
          if (!envNames.has(m[1])) err(overlay, `${cid}: ${a} names $(${m[1]}), not an env var of the container`);
        }
      }
      const podName = (c.env ?? []).find((e) => e.valueFrom?.fieldRef?.fieldPath === "metadata.name")?.name;
      if (fl.get("worker-id") !== `$(${podName})`)
        err(overlay, `${cid}: --worker-id must be the pod's name (got ${fl.get("worker-id")})`);
      // secrets named by flags lie in a secret mount and name a key
      for (const flag of ["cluster-secret-file", "api-key-file"]) {
        if (!fl.has(flag)) continue;
        const path = fl.get(flag);
        const mnt = (c.volumeMounts ?? []).find((m) => path.startsWith(m.mountPath + "/"));
        const vol = mnt && vols.get(mnt.name);
        if (!vol?.secret) {
          err(overlay, `${cid}: --${flag}=${path} is not in a Secret volume`);
          continue;
        }
        if (!mnt.readOnly) err(overlay, `${cid}: the mount of --${flag} is not readOnly`);
        const key = path.slice(mnt.mountPath.length + 1);
        const s = secrets.get(vol.secret.secretName);
        if (s && !(key in (s.data ?? {}))) err(overlay, `${cid}: Secret ${s.metadata.name} has no key '${key}' (--${flag})`);
      }
      // the drain: grace period > the daemon's drain grace + the preStop wait
      const grace = (pod.terminationGracePeriodSeconds ?? 30) * 1000;
      const drainMs = Number(fl.get("drain-grace-ms") ?? 0);
      const pre = c.lifecycle?.preStop?.exec?.command;
      let preWait = 0;
      if (pre) {
        const pbin = pre[0].split("/").pop();
        if (pbin !== "epd-ctl" || pre[1] !== "drain") err(overlay, `${cid}: preStop is not epd-ctl drain`);
        else {
          const known2 = flagsOf("epd-ctl", "drain");
          for (const a of pre.slice(3)) {
            const x = /^--([a-z0-9-]+)$/.exec(a);
            if (x && !known2.has(x[1])) {
              if (!unknownFlags.has("epd-ctl drain")) unknownFlags.set("epd-ctl drain", new Set());
              unknownFlags.get("epd-ctl drain").add(a);
            }
          }
          const wi = pre.indexOf("--wait-ms");
          preWait = wi > 0 ? Number(pre[wi + 1]) : 0;
          if (portOf(pre[2]) !== portOf(fl.get("control-addr")))
            err(overlay, `${cid}: preStop drains port ${portOf(pre[2])}, the daemon's control port is ${portOf(fl.get("control-addr"))}`);
        }
      }
      if (!(grace > drainMs + preWait))
        err(overlay, `${cid}: terminationGracePeriodSeconds ${grace / 1000} s is not above --drain-grace-ms ${drainMs} + preStop --wait-ms ${preWait}`);
      // scraping: every daemon's pods are scraped on the port its /metrics
      // listens on (the router's --listen, a worker's --metrics-addr)
      {
        const ann = d.spec.template.metadata?.annotations ?? {};
        const want = binary === "epd-router" ? portOf(fl.get("listen")) : portOf(fl.get("metrics-addr"));
        if (want === undefined || Number.isNaN(want))
          err(overlay, `${cid}: no /metrics (a worker needs --metrics-addr to be scraped)`);
        else if (ann["prometheus.io/scrape"] !== "true" || Number(ann["prometheus.io/port"]) !== want ||
                 (ann["prometheus.io/path"] ?? "/metrics") !== "/metrics")
          err(overlay, `${cid}: not scraped on its /metrics port ${want} (prometheus.io/scrape, port, path annotations)`);
        else if (binary !== "epd-router" && containerPort(c, "metrics") !== want)
          err(overlay, `${cid}: containerPort 'metrics' is not the --metrics-addr port ${want}`);
      }
      // probes
      if (binary === "epd-router") {
        const http = portOf(fl.get("listen"));
        const live = c.livenessProbe?.httpGet, ready = c.readinessProbe?.httpGet;
        if (live?.path !== "/health") err(overlay, `${cid}: liveness must GET /health`);
        if (ready?.path !== "/ready") err(overlay, `${cid}: readiness must GET /ready`);
        for (const [what, p] of [["liveness", live], ["readiness", ready]]) {
          if (p && containerPort(c, p.port) !== http)
            err(overlay, `${cid}: ${what} probe port ${p.port} is not the --listen port ${http}`);
        }
        if (containerPort(c, "control") !== portOf(fl.get("control-addr")))
          err(overlay, `${cid}: containerPort 'control' is not the --control-addr port`);
      } else {
        const ctl = portOf(fl.get("control-addr"));
        for (const what of ["startupProbe", "livenessProbe", "readinessProbe"]) {
          const p = c[what];
          if (!p) {
            if (what !== "startupProbe") err(overlay, `${cid}: no ${what}`);
            continue;
          }
          if (!p.grpc) err(overlay, `${cid}: ${what} is not a gRPC probe`);
          else if (p.grpc.port !== ctl) err(overlay, `${cid}: ${what} gRPC port ${p.grpc.port} is not the --control-addr port ${ctl}`);
        }
        if (containerPort(c, "control") !== ctl) err(overlay, `${cid}: containerPort 'control' is not the --control-addr port ${ctl}`);
        // --router names a Service that publishes the router before it is ready
        const host = hostOf(fl.get("router")), port = portOf(fl.get("router"));
        const svc = services.find((s) => s.metadata.name === host || `${s.metadata.name}.${s.metadata.namespace}` === host);
        if (!svc) err(overlay, `${cid}: --router ${fl.get("router")}: no Service '${host}'`);
        else {
          if (!(svc.spec.ports ?? []).some((p) => p.port === port)) err(overlay, `${cid}: Service ${host} has no port ${port}`);
          if (svc.spec.publishNotReadyAddresses !== true)
            err(overlay, `${cid}: Service ${host} must publish not-ready addresses (the router is ready only after workers register)`);
        }
      }
    }
  }
  for (const s of services) {
    const sel = deps.filter((d) => matches(s.spec.selector, d.spec.template.metadata.labels));
    if (sel.length !== 1) {
      err(overlay, `Service/${s.metadata.name} selects ${sel.length} Deployments (want 1)`);
      continue;
    }
    const c = sel[0].spec.template.spec.containers[0];
    for (const p of s.spec.ports) {
      if (containerPort(c, p.targetPort ?? p.port) === undefined)
        err(overlay, `Service/${s.metadata.name} port ${p.name}: target ${p.targetPort} is not a port of ${sel[0].metadata.name}`);
    }
  }
  for (const p of pdbs) {
    const n = deps.filter((d) => matches(p.spec.selector.matchLabels, d.spec.template.metadata.labels)).length;
    if (n !== 1) err(overlay, `PodDisruptionBudget/${p.metadata.name} selects ${n} Deployments (want 1)`);
  }
  for (const h of objs.filter((o) => o.kind === "HorizontalPodAutoscaler")) {
    scalers.push([h.spec.scaleTargetRef.name, `HorizontalPodAutoscaler/${h.metadata.name}`]);
    if (h.spec.scaleTargetRef.kind !== "Deployment") err(overlay, `HPA/${h.metadata.name}: target is not a Deployment`);
    if (h.spec.minReplicas > h.spec.maxReplicas) err(overlay, `HPA/${h.metadata.name}: minReplicas > maxReplicas`);
    for (const m of h.spec.metrics) {
      if (m.type !== "External") continue;
      if (!adapterNames.has(m.external.metric.name))
        err(overlay, `HPA/${h.metadata.name}: external metric ${m.external.metric.name} is not served by adapter-rules.yaml`);
    }
  }
  for (const so of objs.filter((o) => o.kind === "ScaledObject")) {
    scalers.push([so.spec.scaleTargetRef.name, `ScaledObject/${so.metadata.name}`]);
    if ((so.spec.minReplicaCount ?? 0) > (so.spec.maxReplicaCount ?? 100)) err(overlay, `ScaledObject/${so.metadata.name}: min > max`);
    for (const t of so.spec.triggers) {
      if (t.type !== "prometheus") continue;
      const q = t.metadata.query;
      if (!testedExprs.has(q)) err(overlay, `ScaledObject/${so.metadata.name}: query '${q}' is not tested in rules_test.yaml`);
      const series = /^([a-zA-Z_:][\w:]*)/.exec(q)?.[1];
      if (!recorded.has(series)) err(overlay, `ScaledObject/${so.metadata.name}: '${series}' is not recorded by rules.yaml`);
      if (!Number.isFinite(Number(t.metadata.threshold))) err(overlay, `ScaledObject/${so.metadata.name}: threshold is not a number`);
    }
  }
  const byTarget = new Map();
  for (const [target, who] of scalers) {
    if (!deps.some((d) => d.metadata.name === target)) err(overlay, `${who}: no Deployment ${target}`);
    if (byTarget.has(target)) err(overlay, `${who} and ${byTarget.get(target)} both scale ${target}`);
    byTarget.set(target, who);
  }
  const kinds = {};
  for (const o of objs) kinds[o.kind] = (kinds[o.kind] ?? 0) + 1;
  summary.push(`${overlay}: ${objs.length} objects (${Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(", ")})`);
}

for (const line of summary) console.log(line);
if (unknownFlags.size > 0) {
  for (const [binary, flags] of unknownFlags) {
    errors.push(`flags the manifests pass that ${binary} --help (${binDir}) does not list: ${[...flags].join(" ")}`);
  }
}
if (errors.length > 0) {
  for (const e of errors) console.error("ERROR " + e);
  console.error(`${errors.length} error(s)`);
  process.exit(1);
}
console.log("schemas and cross-references: ok");
