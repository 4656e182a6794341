// ops/k8s/ashlar.yaml against the Kubernetes API schema, then its workloads run as a
// Kubernetes cluster would run them: each container's command and environment, as many
// processes as its replicas, the Secret and the ConfigMap as files, the Service's name as
// this host's network address. They form a cluster and train.
//
// usage: node k8s_test.mjs ASHLAR_BINARY SOURCE_DIR [EPOCHS]
// Exits 77 (ctest: skipped) without its npm packages (npm ci in tests/k8s) or a network
// address besides loopback.
import fs from 'fs';
import os from 'os';
import path from 'path';
import crypto from 'crypto';
import { spawn, execFileSync } from 'child_process';

const [bin, src, epochs = '1'] = process.argv.slice(2);
const skip = (why) => { console.log(`skipped: ${why}`); process.exit(77); };
const fail = (why) => { console.log(`FAIL: ${why}`); process.exit(1); };
let yaml;
const schemas = {}; // apiVersion -> the module of its kinds' validating classes
try {
  yaml = (await import('js-yaml')).default;
  for (const v of ['v1', 'apps/v1', 'batch/v1'])
    schemas[v] = await import(v === 'v1' ? 'kubernetes-models/v1' : `kubernetes-models/${v}`);
} catch (e) {
  skip(`no npm packages (${e.message}): run \`npm ci --prefix tests/k8s\` (ops/install-deps.sh does)`);
}

// 1. The schema: every document of the manifests validates, and a broken one does not.
const docs = yaml.loadAll(fs.readFileSync(path.join(src, 'ops/k8s/ashlar.yaml'), 'utf8'));
const classOf = (doc) => {
  const cls = schemas[doc.apiVersion] && schemas[doc.apiVersion][doc.kind];
  if (!cls) fail(`no schema here for ${doc.apiVersion} ${doc.kind}`);
  return cls;
};
const validate = (doc) => { new (classOf(doc))(doc).validate(); };
for (const doc of docs) {
  try { validate(doc); } catch (e) { fail(`${doc.kind} ${doc.metadata.name}: ${e.message}`); }
}
const broken = JSON.parse(JSON.stringify(docs.find((d) => d.kind === 'StatefulSet')));
broken.spec.replicas = 'two';
let refused = false;
try { validate(broken); } catch (e) { refused = true; }
if (!refused) fail('the validator accepted a StatefulSet whose replicas is a string');
console.log(`schema: ${docs.length} documents valid (${docs.map((d) => d.kind).join(', ')}); a broken one refused`);

// 2. The workloads, run here.
const ip = (os.networkInterfaces() ? Object.values(os.networkInterfaces()).flat() : [])
  .find((a) => a.family === 'IPv4' && !a.internal);
if (!ip) skip('this host has no network address besides loopback');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ashlar-k8s-'));
const tls = path.join(dir, 'tls'), job = path.join(dir, 'job'), work = path.join(dir, 'work');
fs.mkdirSync(job); fs.mkdirSync(work);
// The Secret: what docs/guides/kubernetes.md makes (ashlar cert, a token).
execFileSync(bin, ['cert', '--ca', path.join(dir, 'ca'), '--out', tls, '--name', 'ashlar-job']);
fs.writeFileSync(path.join(tls, 'token'), crypto.randomBytes(32).toString('base64') + '\n', { mode: 0o600 });
const config = docs.find((d) => d.kind === 'ConfigMap');
fs.writeFileSync(path.join(job, 'job.toml'), config.data['job.toml'].split('/var/lib/ashlar').join(work));
const mounts = { '/etc/ashlar/tls': tls, '/etc/ashlar/job': job, '/var/lib/ashlar': work };
const local = (s) => Object.entries(mounts).reduce((t, [from, to]) => t.split(from).join(to), s);
// The Service's DNS name is this host's address; ports are this run's own.
const port = 21000 + (process.pid % 2000) * 2;
const service = docs.find((d) => d.kind === 'Service').metadata.name;

const procs = [];
const run = (name, container) => {
  const argv = container.command.map((a) => local(a).replace('0.0.0.0:7400', `0.0.0.0:${port}`)
    .replace('0.0.0.0:9400', `0.0.0.0:${port + 1}`));
  argv[0] = bin;
  // This test's own job: a shorter one than the manifest's, on the same config.
  if (argv.includes('scheduler')) argv.push('--epochs', epochs, '--set', 'data.train_limit=12000');
  const env = { ...process.env };
  for (const e of container.env || [])
    env[e.name] = e.name === 'MASTER_ADDR' && e.value === service ? ip.address
      : e.name === 'MASTER_PORT' ? String(port) : e.value;
  const p = spawn(argv[0], argv.slice(1), { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  p.stdout.on('data', (d) => { out += d; });
  p.stderr.on('data', (d) => { out += d; });
  const rec = { name, p, exit: null, out: () => out };
  p.on('exit', (code, sig) => { rec.exit = sig ? 128 + os.constants.signals[sig] : code; });
  procs.push(rec);
  return rec;
};
const killAll = () => procs.forEach((r) => r.exit === null && r.p.kill('SIGKILL'));
process.on('exit', () => { killAll(); fs.rmSync(dir, { recursive: true, force: true }); });

const workloads = docs.filter((d) => d.kind === 'Job' || d.kind === 'StatefulSet');
const scheduler = run('scheduler', workloads.find((d) => d.kind === 'Job').spec.template.spec.containers[0]);
let pods = 1;
for (const w of workloads.filter((d) => d.kind === 'StatefulSet'))
  for (let i = 0; i < (w.spec.replicas || 1); ++i, ++pods)
    run(`${w.metadata.name}-${i}`, w.spec.template.spec.containers[0]);
const worldSize = Number((workloads[1].spec.template.spec.containers[0].env || []).find((e) => e.name === 'WORLD_SIZE').value);
if (worldSize !== pods) fail(`WORLD_SIZE ${worldSize} is not the manifests' ${pods} pods`);

// The scheduler's readiness probe: /metrics on its metrics port answers 200 while it runs.
const probe = docs.find((d) => d.kind === 'Job').spec.template.spec.containers[0].readinessProbe.httpGet;
let ready = false;
const deadline = Date.now() + 240000;
const timer = setInterval(() => {
  if (!ready && scheduler.exit === null)
    fetch(`http://127.0.0.1:${port + 1}${probe.path}`).then((r) => { ready = ready || r.status === 200; }, () => {});
  if (scheduler.exit === null && Date.now() < deadline) return;
  clearInterval(timer);
  const said = scheduler.out();
  if (scheduler.exit !== 0) fail(`the scheduler exited with ${scheduler.exit}:\n${said.slice(-4000)}\n` +
    procs.slice(1).map((r) => `--- ${r.name}\n${r.out().slice(-800)}`).join('\n'));
  const joined = procs.slice(1).filter((r) => /joining the scheduler at .* \(--join auto: kubernetes, from MASTER_ADDR\)/.test(r.out()));
  if (joined.length !== procs.length - 1) fail(`${joined.length} of ${procs.length - 1} nodes found the scheduler from MASTER_ADDR`);
  if (!ready) fail(`the readiness probe (${probe.path}) never answered 200`);
  const rep = JSON.parse(fs.readFileSync(path.join(work, 'report.json'), 'utf8'));
  if (rep.workers !== 3 || !(rep.test_accuracy > 0.7)) fail(`report: ${rep.workers} workers, accuracy ${rep.test_accuracy}`);
  console.log(`run: ${procs.length} processes from the manifests formed a cluster; policy ${rep.policy}, ` +
              `${rep.workers} workers, test accuracy ${rep.test_accuracy}`);
  setTimeout(() => process.exit(0), 200);
}, 200);
