// Greedy generation with llama.cpp (through node-llama-cpp's prebuilt CPU binaries) from given
// prompt token ids, timed like `qkv bench generate`, to compare qkv with llama.cpp.
//
//   node bench/llamacpp_generate.mjs --model M.gguf --prompt-ids ids.json --new-tokens 64 --threads 2 [--json]
//
// node-llama-cpp is not a dependency of this repository: install it anywhere with
// `npm install node-llama-cpp@3.21.1` (it brings llama.cpp prebuilt) and point LCPP_DIR at that
// folder (default /tmp/lcpp); the script imports LCPP_DIR/node_modules/node-llama-cpp. (ES
// modules ignore NODE_PATH, hence the explicit path.) The model comes from
// bench/gguf_from_safetensors.py.
//
// --prompt-ids: a .json array of ids ([1, 2, ...] or [[1, 2, ...]]) or a .npy (int32/int64, shape
// [P] or [1, P], as `qkv generate --prompt-ids` reads). The ids are evaluated exactly as given: no
// BOS added, no tokenization. Then N new tokens, each the argmax of the logits (temperature 0);
// end-of-generation ids are kept like any other (generation never stops early).
//
// Timing, as qkv's bench generate: a warm-up prefill of the prompt first (its time is
// first_prefill_ms; the sequence is then cleared; --no-warmup skips it), then prefill_ms = the
// prompt's evaluation and the first new token, and decode_ms = the N - 1 steps after it (each
// one token evaluated and the next chosen), decode_tokens_per_s = (N - 1) / decode_ms.
//
// Options: --kv-type f16|f32 (the KV cache; default f16, llama.cpp's default; f32 to compare the
// ids of an f32 model exactly), --flash-attention auto|on|off (default auto), --out ids.json (the
// prompt and new ids, one flat array), --quiet-llama (default: llama.cpp's warnings and errors
// only). Prints one JSON object (pretty unless --json).

import fs from "node:fs";
import path from "node:path";
import {pathToFileURL} from "node:url";

function usage(msg) {
    if (msg) console.error(`llamacpp_generate: ${msg}`);
    console.error(
        "usage: node bench/llamacpp_generate.mjs --model M.gguf --prompt-ids ids.json|ids.npy --new-tokens N " +
        "[--threads T] [--kv-type f16|f32] [--flash-attention auto|on|off] [--no-warmup] [--out ids.json] [--json]"
    );
    process.exit(2);
}

function parseArgs(argv) {
    const o = {threads: 2, kvType: "f16", flashAttention: "auto", warmup: true, json: false};
    for (let i = 0; i < argv.length; ++i) {
        const a = argv[i];
        const val = () => {
            if (i + 1 >= argv.length) usage(`${a} needs a value`);
            return argv[++i];
        };
        if (a === "--model") o.model = val();
        else if (a === "--prompt-ids") o.promptIds = val();
        else if (a === "--new-tokens") o.newTokens = Number(val());
        else if (a === "--threads") o.threads = Number(val());
        else if (a === "--kv-type") o.kvType = val();
        else if (a === "--flash-attention") o.flashAttention = val();
        else if (a === "--out") o.out = val();
        else if (a === "--no-warmup") o.warmup = false;
        else if (a === "--json") o.json = true;
        else if (a === "-h" || a === "--help") usage();
        else usage(`unknown argument ${a}`);
    }
    if (!o.model) usage("--model is required");
    if (!o.promptIds) usage("--prompt-ids is required");
    if (!Number.isInteger(o.newTokens) || o.newTokens < 1) usage("--new-tokens must be a positive integer");
    if (!Number.isInteger(o.threads) || o.threads < 1) usage("--threads must be a positive integer");
    if (!["f16", "f32"].includes(o.kvType)) usage("--kv-type must be f16 or f32");
    if (!["auto", "on", "off"].includes(o.flashAttention)) usage("--flash-attention must be auto, on or off");
    return o;
}

/// A .npy of integers (little-endian int32/int64/uint32, C order), flattened.
function readNpy(file) {
    const buf = fs.readFileSync(file);
    if (buf.toString("latin1", 0, 6) !== "\x93NUMPY") throw new Error(`${file}: not a .npy file`);
    const major = buf[6];
    const hlen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
    const hstart = major === 1 ? 10 : 12;
    const header = buf.toString("latin1", hstart, hstart + hlen);
    const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
    if (/'fortran_order':\s*True/.test(header)) throw new Error(`${file}: Fortran order is not supported`);
    const data = buf.subarray(hstart + hlen);
    const ab = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
    if (descr === "<i8") return Array.from(new BigInt64Array(ab), Number);
    if (descr === "<i4") return Array.from(new Int32Array(ab));
    if (descr === "<u4") return Array.from(new Uint32Array(ab));
    throw new Error(`${file}: dtype ${descr} is not supported (int32 or int64)`);
}

function readIds(file) {
    const ids = file.endsWith(".npy") ? readNpy(file) : JSON.parse(fs.readFileSync(file, "utf8")).flat(Infinity);
    if (ids.length === 0 || !ids.every(Number.isInteger)) throw new Error(`${file}: expected a non-empty list of integer ids`);
    return ids;
}

const o = parseArgs(process.argv.slice(2));
const lcppDir = process.env.LCPP_DIR ?? "/tmp/lcpp";
const entry = path.join(lcppDir, "node_modules", "node-llama-cpp", "dist", "index.js");
if (!fs.existsSync(entry)) usage(`${entry} not found: run \`npm install node-llama-cpp@3.21.1\` in LCPP_DIR (${lcppDir})`);
const {getLlama, LlamaLogLevel} = await import(pathToFileURL(entry).href);

const prompt = readIds(o.promptIds);
const P = prompt.length, N = o.newTokens;
const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6;

const llama = await getLlama({
    gpu: false,
    build: "never",
    maxThreads: o.threads,
    logLevel: LlamaLogLevel.warn,
    progressLogs: false
});
let t0 = process.hrtime.bigint();
const model = await llama.loadModel({modelPath: o.model, gpuLayers: 0});
const nVocab = model.fileInfo.metadata?.llama?.vocab_size ?? model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length;
if (nVocab != null) {
    const bad = prompt.find((id) => id < 0 || id >= nVocab);
    if (bad != null) usage(`prompt id ${bad} is outside the vocabulary (${nVocab})`);
}
const context = await model.createContext({
    contextSize: P + N,
    batchSize: P,                 // the whole prompt in one batch (and one ubatch)
    sequences: 1,
    threads: {ideal: o.threads, min: o.threads},
    flashAttention: o.flashAttention === "auto" ? undefined : o.flashAttention === "on",
    experimentalKvCacheKeyType: o.kvType.toUpperCase(),
    experimentalKvCacheValueType: o.kvType.toUpperCase(),
    ignoreMemorySafetyChecks: true
});
const loadMs = ms(t0);
if (context.contextSize < P + N) throw new Error(`context size ${context.contextSize} < ${P + N}`);
if (context.batchSize < P) throw new Error(`batch size ${context.batchSize} < ${P}`);
const sequence = context.getSequence();
const greedy = {temperature: 0, yieldEogToken: true};

// One generation: the prompt, then n new ids; returns {prefillMs, decodeMs, ids}.
async function generate(n) {
    const ids = [];
    let prefillMs = 0, decodeMs = 0;
    let t = process.hrtime.bigint();
    const it = sequence.evaluate(prompt, greedy);
    for (;;) {
        const r = await it.next();
        if (r.done) throw new Error(`generation stopped after ${ids.length} of ${n} new tokens`);
        if (ids.length === 0) prefillMs = ms(t);
        else decodeMs += ms(t);
        ids.push(r.value);
        if (ids.length === n) break;
        t = process.hrtime.bigint();
    }
    await it.return();
    return {prefillMs, decodeMs, ids};
}

let firstPrefillMs = null;
if (o.warmup) {
    firstPrefillMs = (await generate(1)).prefillMs;
    await sequence.clearHistory();
}
const r = await generate(N);
const steps = N - 1;
const result = {
    engine: "llama.cpp (node-llama-cpp " + (await import(pathToFileURL(path.join(lcppDir, "node_modules", "node-llama-cpp", "package.json")).href, {with: {type: "json"}})).default.version + ")",
    model: o.model,
    prompt_tokens: P,
    new_tokens: N,
    decode_steps: steps,
    threads: context.idealThreads,
    kv_type: o.kvType,
    flash_attention: context.flashAttention,
    context_size: context.contextSize,
    batch_size: context.batchSize,
    load_ms: loadMs,
    first_prefill_ms: firstPrefillMs,
    prefill_ms: r.prefillMs,
    prefill_tokens_per_s: 1e3 * P / r.prefillMs,
    decode_ms: r.decodeMs,
    decode_tokens_per_s: steps > 0 ? 1e3 * steps / r.decodeMs : 0,
    ids: r.ids
};
if (o.out) fs.writeFileSync(o.out, JSON.stringify([...prompt, ...r.ids]) + "\n");
console.log(o.json ? JSON.stringify(result) : JSON.stringify(result, null, 2));
await context.dispose();
await model.dispose();
await llama.dispose();
