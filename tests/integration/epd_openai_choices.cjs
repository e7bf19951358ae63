// epd_openai_choices.cjs — several choices in one answer through the
// official OpenAI Node SDK (run by test_openai_choices.sh, never on its
// own):
//
//   node epd_openai_choices.cjs SDK_DIR BASE_URL MODEL_NAME MODEL_DIR GENERATE_BIN
//
// n > 1 (completions and chat, streamed and not): n distinct choices,
// choice i equal to epd-generate with seed + i, the same on a second call;
// a batch of prompts (strings and token ids): one choice per prompt in
// order, each equal to that prompt's own answer, usage summed; echo: the
// prompt before the text; and the hostile battery (n -1, 0, 17, 10000, a
// batch of 10000 prompts, nested lists, n x prompts past the cap, echo
// with logprobs): each the SDK's BadRequestError naming its field.
// Prints one line per check; exits 1 at the first difference.
'use strict';

const path = require('path');
const { execFileSync } = require('child_process');

const [sdkDir, baseURL, modelName, modelDir, genBin] = process.argv.slice(2);
if (!genBin) {
  console.error('usage: node epd_openai_choices.cjs SDK_DIR BASE_URL MODEL_NAME MODEL_DIR ' +
                'GENERATE_BIN');
  process.exit(2);
}
const sdk = require(path.resolve(sdkDir, 'node_modules', 'openai'));
const OpenAI = sdk.OpenAI || sdk.default || sdk;

function fail(msg) {
  console.error('FAIL: ' + msg);
  process.exit(1);
}

function generate(prompt, maxTokens, temperature, seed) {
  const out = execFileSync(genBin, ['--model', modelDir, '--prompt', prompt, '--max-tokens',
                                    String(maxTokens), '--temperature', String(temperature),
                                    '--seed', String(seed)]);
  if (out.length === 0 || out[out.length - 1] !== 0x0a) {
    fail('epd-generate output does not end in a newline');
  }
  return out.subarray(0, out.length - 1).toString('utf8');
}

function same(what, want, got) {
  if (want !== got) {
    fail(what + ': the SDK got ' + JSON.stringify(got) + ', want ' + JSON.stringify(want));
  }
}

// A streamed answer's text per choice index, its finish reasons and usage.
async function collect(stream, chat) {
  const texts = [];
  const finish = [];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) {
      usage = chunk.usage;
    }
    for (const ch of chunk.choices) {
      const t = chat ? (ch.delta && ch.delta.content) || '' : ch.text || '';
      texts[ch.index] = (texts[ch.index] || '') + t;
      if (ch.finish_reason) {
        finish[ch.index] = ch.finish_reason;
      }
    }
  }
  return { texts, finish, usage };
}

async function main() {
  const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  const prompt = 'Several choices of one prompt, each seeded on its own.';
  const maxTokens = 16;
  const temp = 0.9;
  const seed = 11;
  const n = 3;

  // n = 3, seeded: choice i == epd-generate --seed seed+i, distinct, reproducible
  const want = [];
  for (let i = 0; i < n; i++) {
    want.push(generate(prompt, maxTokens, temp, seed + i));
  }
  if (new Set(want).size !== n) {
    fail('epd-generate gave equal texts for seeds ' + seed + '..' + (seed + n - 1));
  }
  for (let round = 0; round < 2; round++) {
    const c = await client.completions.create({ model: modelName, prompt, max_tokens: maxTokens,
                                                temperature: temp, seed, n });
    if (c.choices.length !== n) {
      fail('n=3: ' + c.choices.length + ' choices');
    }
    c.choices.forEach((ch, i) => {
      if (ch.index !== i) {
        fail('choice ' + i + ' has index ' + ch.index);
      }
      same('n=3 choice ' + i + ' (round ' + round + ')', want[i], ch.text);
    });
    if (c.usage.completion_tokens !== n * maxTokens && c.usage.completion_tokens < n) {
      fail('n=3 usage ' + JSON.stringify(c.usage));
    }
  }
  console.log('ok n=3 seeded: 3 distinct choices == epd-generate seed+i, twice');
  {
    const s = await collect(await client.completions.create({
      model: modelName, prompt, max_tokens: maxTokens, temperature: temp, seed, n,
      stream: true, stream_options: { include_usage: true } }), false);
    for (let i = 0; i < n; i++) {
      same('streamed n=3 choice ' + i, want[i], s.texts[i]);
      if (!s.finish[i]) {
        fail('streamed n=3 choice ' + i + ' has no finish_reason');
      }
    }
    if (!s.usage || s.usage.completion_tokens < n) {
      fail('streamed n=3 usage ' + JSON.stringify(s.usage));
    }
    console.log('ok streamed n=3: each index == epd-generate seed+i, usage ' +
                JSON.stringify(s.usage));
  }

  // logprobs with n = 2: each choice its own, one entry per token, equal
  // to the same choice alone (seed + 1 for choice 1)
  {
    const c = await client.completions.create({ model: modelName, prompt, max_tokens: 6,
                                                temperature: temp, seed, n: 2, logprobs: 2 });
    const one = await client.completions.create({ model: modelName, prompt, max_tokens: 6,
                                                  temperature: temp, seed: seed + 1,
                                                  logprobs: 2 });
    const lp = c.choices[1].logprobs;
    if (!lp || JSON.stringify(lp) !== JSON.stringify(one.choices[0].logprobs) ||
        !c.choices[0].logprobs || c.choices[0].logprobs.tokens.length < 1) {
      fail('n=2 logprobs: ' + JSON.stringify(c.choices) + ' vs ' + JSON.stringify(one.choices));
    }
    const s = await client.completions.create({ model: modelName, prompt, max_tokens: 6,
                                                temperature: temp, seed, n: 2, logprobs: 2,
                                                stream: true });
    const toks = [[], []];
    for await (const chunk of s) {
      for (const ch of chunk.choices) {
        if (ch.logprobs) {
          toks[ch.index] = toks[ch.index].concat(ch.logprobs.tokens);
        }
      }
    }
    if (JSON.stringify(toks[1]) !== JSON.stringify(lp.tokens)) {
      fail('streamed n=2 logprobs ' + JSON.stringify(toks) + ' vs ' + JSON.stringify(lp.tokens));
    }
    console.log('ok n=2 logprobs: choice 1 == seed+1 alone, streamed and not');
  }

  // chat, n = 2
  {
    const chatPrompt = '<|user|>\n' + prompt + '\n<|assistant|>\n';
    const w = [generate(chatPrompt, 8, temp, seed), generate(chatPrompt, 8, temp, seed + 1)];
    const c = await client.chat.completions.create({
      model: modelName, messages: [{ role: 'user', content: prompt }], max_tokens: 8,
      temperature: temp, seed, n: 2 });
    same('chat n=2 choice 0', w[0], c.choices[0].message.content);
    same('chat n=2 choice 1', w[1], c.choices[1].message.content);
    const s = await collect(await client.chat.completions.create({
      model: modelName, messages: [{ role: 'user', content: prompt }], max_tokens: 8,
      temperature: temp, seed, n: 2, stream: true }), true);
    same('streamed chat n=2 choice 0', w[0], s.texts[0]);
    same('streamed chat n=2 choice 1', w[1], s.texts[1]);
    console.log('ok chat n=2, streamed and not');
  }

  // a batch: one choice per prompt, in order, each its own answer
  {
    const tok = await fetch(baseURL.replace(/\/v1$/, '') + '/tokenize', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: modelName, prompt: 'A prompt of token ids.' }) });
    const ids = (await tok.json()).tokens;
    const prompts = ['The first prompt.', 'A second, longer prompt of the batch.', ids,
                     'The last one'];
    const single = [];
    let promptTokens = 0;
    let completionTokens = 0;
    for (const p of prompts) {
      const c = await client.completions.create({ model: modelName, prompt: p, max_tokens: 10,
                                                  temperature: 0.7, seed: 3 });
      single.push(c.choices[0].text);
      promptTokens += c.usage.prompt_tokens;
      completionTokens += c.usage.completion_tokens;
    }
    const b = await client.completions.create({ model: modelName, prompt: prompts,
                                                max_tokens: 10, temperature: 0.7, seed: 3 });
    if (b.choices.length !== prompts.length) {
      fail('batch: ' + b.choices.length + ' choices for ' + prompts.length + ' prompts');
    }
    b.choices.forEach((ch, i) => {
      if (ch.index !== i) {
        fail('batch choice ' + i + ' has index ' + ch.index);
      }
      same('batch prompt ' + i, single[i], ch.text);
    });
    if (b.usage.prompt_tokens !== promptTokens || b.usage.completion_tokens !== completionTokens) {
      fail('batch usage ' + JSON.stringify(b.usage) + ', the prompts alone ' + promptTokens +
           ' + ' + completionTokens);
    }
    const s = await collect(await client.completions.create({
      model: modelName, prompt: prompts, max_tokens: 10, temperature: 0.7, seed: 3,
      stream: true, stream_options: { include_usage: true } }), false);
    prompts.forEach((p, i) => same('streamed batch prompt ' + i, single[i], s.texts[i]));
    if (!s.usage || s.usage.completion_tokens !== completionTokens) {
      fail('streamed batch usage ' + JSON.stringify(s.usage));
    }
    // a batch with n = 2: prompt p's choice c is index p*2 + c, seeded seed + c
    const bn = await client.completions.create({ model: modelName, prompt: prompts.slice(0, 2),
                                                 max_tokens: 10, temperature: 0.7, seed: 2,
                                                 n: 2 });
    if (bn.choices.length !== 4) {
      fail('batch of 2 with n=2: ' + bn.choices.length + ' choices');
    }
    same('batch x n: prompt 0 choice 1', single[0], bn.choices[1].text);
    same('batch x n: prompt 1 choice 1', single[1], bn.choices[3].text);
    console.log('ok batch of ' + prompts.length + ' prompts (text and token ids) in order, ' +
                'streamed and not, usage summed; batch x n=2');
  }

  // echo: the prompt before the text
  {
    const c = await client.completions.create({ model: modelName, prompt, max_tokens: 8,
                                                temperature: 0 });
    const e = await client.completions.create({ model: modelName, prompt, max_tokens: 8,
                                                temperature: 0, echo: true });
    same('echo', prompt + c.choices[0].text, e.choices[0].text);
    const s = await collect(await client.completions.create({
      model: modelName, prompt, max_tokens: 8, temperature: 0, echo: true, stream: true }), false);
    same('streamed echo', prompt + c.choices[0].text, s.texts[0]);
    const en = await client.completions.create({ model: modelName, prompt: [prompt, 'Two'],
                                                 max_tokens: 4, temperature: 0, echo: true });
    if (!en.choices[1].text.startsWith('Two') || !en.choices[0].text.startsWith(prompt)) {
      fail('echo in a batch: ' + JSON.stringify(en.choices));
    }
    console.log('ok echo: prompt + text, streamed and not, in a batch');
  }

  // hostile: every one a BadRequestError naming its field
  const big = [];
  for (let i = 0; i < 10000; i++) {
    big.push('p');
  }
  const cases = [
    [{ n: -1 }, 'n'], [{ n: 0 }, 'n'], [{ n: 17 }, 'n'], [{ n: 10000 }, 'n'],
    [{ n: 2.5 }, 'n'], [{ n: 16, prompt: ['a', 'b', 'c', 'd', 'e'] }, 'n'],
    [{ prompt: big }, 'prompt'], [{ prompt: [] }, 'prompt'], [{ prompt: [[]] }, 'prompt'],
    [{ prompt: [['a']] }, 'prompt'], [{ prompt: [[[1]]] }, 'prompt'],
    [{ prompt: ['a', [1, 'x']] }, 'prompt'], [{ prompt: ['a', 7] }, 'prompt'],
    [{ prompt: ['a', null] }, 'prompt'], [{ prompt: ['a', [999999]] }, 'prompt[1]'],
    [{ echo: true, logprobs: 2 }, 'echo'], [{ echo: 1 }, 'echo'],
  ];
  for (const [extra, param] of cases) {
    try {
      await client.completions.create(Object.assign({ model: modelName, prompt: 'x',
                                                      max_tokens: 2 }, extra));
      fail('a request with ' + JSON.stringify(extra).slice(0, 80) + ' succeeded');
    } catch (e) {
      if (!(e instanceof OpenAI.BadRequestError) || e.status !== 400 || e.param !== param) {
        fail(JSON.stringify(extra).slice(0, 80) + ': ' + e + ' (status ' + e.status +
             ', param ' + e.param + ', want ' + param + ')');
      }
    }
  }
  try {
    await client.chat.completions.create({ model: modelName, max_tokens: 2, n: 17,
                                           messages: [{ role: 'user', content: 'x' }] });
    fail('chat n=17 succeeded');
  } catch (e) {
    if (!(e instanceof OpenAI.BadRequestError) || e.param !== 'n') {
      fail('chat n=17: ' + e);
    }
  }
  console.log('ok hostile battery: ' + (cases.length + 1) + ' requests, each a 400 naming its ' +
              'field');
}

main().catch((e) => fail(e && e.stack ? e.stack : String(e)));
