// epd_k8s_render.mjs — renders a kustomization the way `kustomize build`
// does, for the subset deploy/k8s uses, so the manifests can be checked
// where no kustomize is installed (Debian 12 has none).  Anything outside
// the subset is refused, never ignored, so a manifest this renders is one
// kustomize renders the same way (tests/deploy/test_k8s_manifests.sh also
// compares the two whenever a real kustomize is at hand).
//
//   node epd_k8s_render.mjs NODE_MODULES DIR      -> YAML stream on stdout
//
// The subset: resources (files, or folders holding a kustomization),
// namespace, images (name -> newName/newTag), replicas, patches (JSON 6902
// op lists from `path` or `patch`, selected by `target` kind/name — names
// are anchored regular expressions, as in kustomize), secretGenerator
// (`files`, with generatorOptions.disableNameSuffixHash: true).  Order as
// kustomize's: each folder's resources rendered whole, generators, then
// patches, namespace, replicas, images.  YAML 1.1 (what the API server and
// kustomize read: 0400 is octal).
import { readFileSync, existsSync, statSync } from "node:fs";
import { join, dirname, resolve } from "node:path";
import { createRequire } from "node:module";

const [nodeModules, dir] = process.argv.slice(2);
if (!nodeModules || !dir) {
  console.error("usage: node epd_k8s_render.mjs NODE_MODULES DIR");
  process.exit(2);
}
const require = createRequire(join(resolve(nodeModules), "x.js"));
const YAML = require("yaml");

function die(msg) {
  console.error("render: " + msg);
  process.exit(1);
}

const CLUSTER_SCOPED = new Set([
  "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
  "PersistentVolume", "StorageClass", "PriorityClass", "ValidatingWebhookConfiguration",
  "MutatingWebhookConfiguration", "APIService",
]);
const KUSTOMIZATION_KEYS = new Set([
  "apiVersion", "kind", "namespace", "resources", "images", "replicas", "patches",
  "secretGenerator", "generatorOptions",
]);

function parseDocs(text, where) {
  const docs = YAML.parseAllDocuments(text, { version: "1.1" });
  const out = [];
  for (const d of docs) {
    if (d.errors.length) die(`${where}: ${d.errors[0].message}`);
    const v = d.toJS();
    if (v !== null && v !== undefined) out.push(v);
  }
  return out;
}

function kustomizationFile(d) {
  for (const n of ["kustomization.yaml", "kustomization.yml", "Kustomization"]) {
    if (existsSync(join(d, n))) return join(d, n);
  }
  return null;
}

// JSON pointer segments (RFC 6901)
function segs(path) {
  if (path === "") return [];
  if (!path.startsWith("/")) die(`bad JSON pointer '${path}'`);
  return path.slice(1).split("/").map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"));
}

function walk(doc, parts, where) {
  let cur = doc;
  for (const p of parts) {
    if (Array.isArray(cur)) {
      const i = Number(p);
      if (!/^\d+$/.test(p) || i >= cur.length) die(`${where}: no index ${p}`);
      cur = cur[i];
    } else if (cur !== null && typeof cur === "object") {
      if (!(p in cur)) die(`${where}: no member '${p}'`);
      cur = cur[p];
    } else {
      die(`${where}: cannot descend into a scalar at '${p}'`);
    }
  }
  return cur;
}

function deepEqual(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

// RFC 6902 on one object (add, remove, replace, test; what deploy/k8s uses)
function applyJson6902(obj, ops, where) {
  for (const op of ops) {
    const w = `${where}: ${op.op} ${op.path}`;
    const parts = segs(op.path);
    const last = parts.pop();
    const parent = walk(obj, parts, w);
    switch (op.op) {
      case "test": {
        const v = walk(obj, [...parts, last], w);
        if (!deepEqual(v, op.value)) die(`${w}: test failed (is ${JSON.stringify(v)})`);
        break;
      }
      case "add":
        if (Array.isArray(parent)) {
          if (last === "-") parent.push(structuredClone(op.value));
          else {
            const i = Number(last);
            if (!/^\d+$/.test(last) || i > parent.length) die(`${w}: bad index`);
            parent.splice(i, 0, structuredClone(op.value));
          }
        } else if (parent !== null && typeof parent === "object") {
          parent[last] = structuredClone(op.value);
        } else die(`${w}: parent is a scalar`);
        break;
      case "replace":
        walk(obj, [...parts, last], w); // must exist
        if (Array.isArray(parent)) parent[Number(last)] = structuredClone(op.value);
        else parent[last] = structuredClone(op.value);
        break;
      case "remove":
        walk(obj, [...parts, last], w);
        if (Array.isArray(parent)) parent.splice(Number(last), 1);
        else delete parent[last];
        break;
      default:
        die(`${w}: op '${op.op}' is outside the subset`);
    }
  }
}

function nameMatches(re, name) {
  return new RegExp(`^(?:${re})$`).test(name);
}

function render(d, seen = new Set()) {
  const kf = kustomizationFile(d);
  if (!kf) die(`${d}: no kustomization.yaml`);
  if (seen.has(resolve(d))) die(`${d}: a cycle of resources`);
  seen = new Set(seen).add(resolve(d));
  const [k] = parseDocs(readFileSync(kf, "utf8"), kf);
  for (const key of Object.keys(k)) {
    if (!KUSTOMIZATION_KEYS.has(key)) die(`${kf}: '${key}' is outside the renderer's subset`);
  }
  if (k.kind !== "Kustomization") die(`${kf}: kind is not Kustomization`);
  let objs = [];
  for (const r of k.resources ?? []) {
    const p = join(d, r);
    if (!existsSync(p)) die(`${kf}: resource '${r}' does not exist`);
    if (statSync(p).isDirectory()) objs.push(...render(p, seen));
    else objs.push(...parseDocs(readFileSync(p, "utf8"), p));
  }
  const opts = k.generatorOptions ?? {};
  for (const key of Object.keys(opts)) {
    if (key !== "disableNameSuffixHash") die(`${kf}: generatorOptions.${key} is outside the subset`);
  }
  for (const g of k.secretGenerator ?? []) {
    if (opts.disableNameSuffixHash !== true) die(`${kf}: name-suffix hashes are outside the subset`);
    for (const key of Object.keys(g)) {
      if (!["name", "files", "type"].includes(key)) die(`${kf}: secretGenerator.${key} is outside the subset`);
    }
    const data = {};
    for (const f of g.files ?? []) {
      const [key, path] = f.includes("=") ? f.split("=", 2) : [f.split("/").pop(), f];
      const p = join(d, path);
      if (!existsSync(p)) die(`${kf}: secretGenerator ${g.name}: file '${path}' does not exist (run deploy/k8s/make-secrets.sh)`);
      data[key] = readFileSync(p).toString("base64");
    }
    objs.push({ apiVersion: "v1", kind: "Secret", metadata: { name: g.name }, type: g.type ?? "Opaque", data });
  }
  for (const p of k.patches ?? []) {
    for (const key of Object.keys(p)) {
      if (!["path", "patch", "target"].includes(key)) die(`${kf}: patches.${key} is outside the subset`);
    }
    const text = p.path ? readFileSync(join(d, p.path), "utf8") : p.patch;
    const [ops] = parseDocs(text, p.path ?? kf);
    if (!Array.isArray(ops)) die(`${kf}: only JSON 6902 patches (a list of ops) are in the subset`);
    const t = p.target ?? die(`${kf}: a JSON 6902 patch needs a target`);
    for (const key of Object.keys(t)) {
      if (!["kind", "name"].includes(key)) die(`${kf}: patch target.${key} is outside the subset`);
    }
    let hits = 0;
    for (const o of objs) {
      if (t.kind && !nameMatches(t.kind, o.kind)) continue;
      if (t.name && !nameMatches(t.name, o.metadata?.name ?? "")) continue;
      applyJson6902(o, ops, `${p.path ?? "patch"} on ${o.kind}/${o.metadata.name}`);
      hits++;
    }
    if (hits === 0) die(`${kf}: patch ${p.path ?? ""} matches nothing`);
  }
  if (k.namespace) {
    for (const o of objs) {
      if (o.kind === "Namespace") continue;
      if (!CLUSTER_SCOPED.has(o.kind)) o.metadata.namespace = k.namespace;
    }
  }
  for (const r of k.replicas ?? []) {
    const hits = objs.filter((o) => o.metadata?.name === r.name && o.spec && "replicas" in o.spec);
    if (hits.length === 0) die(`${kf}: replicas: no '${r.name}' with spec.replicas`);
    for (const o of hits) o.spec.replicas = r.count;
  }
  for (const im of k.images ?? []) {
    for (const o of objs) {
      const pod = o.spec?.template?.spec;
      for (const c of [...(pod?.containers ?? []), ...(pod?.initContainers ?? [])]) {
        const m = /^([^@:]+(?::\d+\/[^@:]+)?)(?::([^@]+))?(@.*)?$/.exec(c.image ?? "");
        if (!m || m[1] !== im.name) continue;
        c.image = (im.newName ?? m[1]) + (im.newTag ? `:${im.newTag}` : m[2] ? `:${m[2]}` : "");
      }
    }
  }
  return objs;
}

const objs = render(dir);
process.stdout.write(objs.map((o) => YAML.stringify(o, { version: "1.1" })).join("---\n"));
