// epd_openai_sdk.cjs — the official OpenAI Node SDK against a running
// epd-router (run by test_openai_sdk.sh, never on its own):
//
//   node epd_openai_sdk.cjs SDK_DIR BASE_URL MODEL_NAME MODEL_DIR GENERATE_BIN API_KEY
//
// SDK_DIR holds node_modules/openai.  With base_url pointed at the router,
// apiKey one of its keys (--api-key-file) and nothing else changed, the
// SDK must: refuse with its AuthenticationError (401, code
// invalid_api_key) when given a wrong key; list the model; get a chat
// completion and a completion, non-streaming and streaming, whose text
// equals epd-generate's for the same prompt and sampling (chat: the
// prompt rendered with the router's template), with usage; and turn a bad
// request into its APIError with the router's 4xx status and message.
// Prints one line per check; exits 1 at the first difference.
'use strict';

const path = require('path');
const { execFileSync } = require('child_process');

const [sdkDir, baseURL, modelName, modelDir, genBin, apiKey] = process.argv.slice(2);
if (!apiKey) {
  console.error('usage: node epd_openai_sdk.cjs SDK_DIR BASE_URL MODEL_NAME MODEL_DIR ' +
                'GENERATE_BIN API_KEY');
  process.exit(2);
}
const sdk = require(path.resolve(sdkDir, 'node_modules', 'openai'));
const OpenAI = sdk.OpenAI || sdk.default || sdk;

function fail(msg) {
  console.error('FAIL: ' + msg);
  process.exit(1);
}

// The router's chat template (api/epd_openai.c), one user message.
function chatPrompt(content) {
  return '<|user|>\n' + content + '\n<|assistant|>\n';
}

// epd-generate's text (it ends its output with one newline); extra: more
// flags (the sampling fields' own).
function generate(prompt, maxTokens, s, extra) {
  const args = ['--model', modelDir, '--prompt', prompt, '--max-tokens', String(maxTokens),
                '--temperature', String(s.temperature), '--top-p', String(s.top_p),
                '--seed', String(s.seed)].concat(extra || []);
  const out = execFileSync(genBin, args);
  if (out.length === 0 || out[out.length - 1] !== 0x0a) {
    fail('epd-generate output does not end in a newline');
  }
  return out.subarray(0, out.length - 1).toString('utf8');
}

function same(what, want, got) {
  if (want !== got) {
    fail(what + ': the SDK got ' + JSON.stringify(got) + ', epd-generate says ' +
         JSON.stringify(want));
  }
  console.log('ok ' + what + ' (' + Buffer.byteLength(got) + ' bytes)');
}

async function main() {
  // a wrong key: the router's 401 becomes the SDK's AuthenticationError
  const wrong = new OpenAI({ baseURL: baseURL, apiKey: apiKey + '-wrong', maxRetries: 0,
                             timeout: 60000 });
  for (const call of [() => wrong.models.list(),
                      () => wrong.completions.create({ model: modelName, prompt: 'x',
                                                       max_tokens: 2 })]) {
    try {
      await call();
      fail('a request with a wrong key succeeded');
    } catch (e) {
      if (!(e instanceof OpenAI.AuthenticationError) || e.status !== 401 ||
          e.code !== 'invalid_api_key') {
        fail('a wrong key: ' + e + ' (status ' + e.status + ', code ' + e.code + ')');
      }
    }
  }
  console.log('ok wrong key -> AuthenticationError 401 invalid_api_key');

  const client = new OpenAI({ baseURL: baseURL, apiKey: apiKey, maxRetries: 0,
                              timeout: 60000 });
  const prompt = 'The official SDK asks the router for a story about disaggregation.';
  const samplings = [
    { temperature: 0, top_p: 1, seed: 0 },
    { temperature: 0.9, top_p: 0.9, seed: 42 },
  ];
  const maxTokens = 24;

  const models = await client.models.list();
  const ids = [];
  for await (const m of models) {
    ids.push(m.id);
  }
  if (!ids.includes(modelName)) {
    fail('models.list() lacks ' + modelName + ': ' + JSON.stringify(ids));
  }
  console.log('ok models.list: ' + ids.join(','));

  for (const s of samplings) {
    const tag = 'temperature ' + s.temperature;
    const wantChat = generate(chatPrompt(prompt), maxTokens, s);
    const wantText = generate(prompt, maxTokens, s);

    const c = await client.chat.completions.create({
      model: modelName, messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens,
      temperature: s.temperature, top_p: s.top_p, seed: s.seed,
    });
    if (!c.choices || c.choices.length !== 1 || c.choices[0].message.role !== 'assistant') {
      fail('chat completion shape: ' + JSON.stringify(c));
    }
    if (!c.usage || c.usage.completion_tokens < 1 || c.usage.prompt_tokens < 1) {
      fail('chat completion usage: ' + JSON.stringify(c.usage));
    }
    same('chat, ' + tag, wantChat, c.choices[0].message.content);

    const stream = await client.chat.completions.create({
      model: modelName, messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens,
      temperature: s.temperature, top_p: s.top_p, seed: s.seed, stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish = null;
    let usage = null;
    let events = 0;
    for await (const chunk of stream) {
      events++;
      if (chunk.usage) {
        usage = chunk.usage;
      }
      for (const ch of chunk.choices) {
        if (ch.delta && typeof ch.delta.content === 'string') {
          text += ch.delta.content;
        }
        if (ch.finish_reason) {
          finish = ch.finish_reason;
        }
      }
    }
    if (finish !== 'length' && finish !== 'stop') {
      fail('streamed chat: finish_reason ' + finish);
    }
    if (!usage || usage.completion_tokens !== c.usage.completion_tokens) {
      fail('streamed chat usage ' + JSON.stringify(usage) + ' vs ' + JSON.stringify(c.usage));
    }
    same('streamed chat, ' + tag + ', ' + events + ' events', wantChat, text);

    const t = await client.completions.create({
      model: modelName, prompt: prompt, max_tokens: maxTokens, temperature: s.temperature,
      top_p: s.top_p, seed: s.seed,
    });
    same('completion, ' + tag, wantText, t.choices[0].text);

    const ts = await client.completions.create({
      model: modelName, prompt: prompt, max_tokens: maxTokens, temperature: s.temperature,
      top_p: s.top_p, seed: s.seed, stream: true,
    });
    text = '';
    for await (const chunk of ts) {
      for (const ch of chunk.choices) {
        text += ch.text || '';
      }
    }
    same('streamed completion, ' + tag, wantText, text);
  }

  // the sampling fields through the SDK, as typed (presence_penalty,
  // frequency_penalty, logit_bias) and as extra body keys (vLLM's
  // repetition_penalty, min_tokens), == epd-generate with the same flags
  for (const s of samplings) {
    const tag = 'penalties, temperature ' + s.temperature;
    const want = generate(prompt, maxTokens, s,
                          ['--presence-penalty', '0.7', '--frequency-penalty', '0.4',
                           '--repetition-penalty', '1.3', '--logit-bias', '101:3,32:-2',
                           '--min-tokens', '4']);
    const body = {
      model: modelName, prompt: prompt, max_tokens: maxTokens, temperature: s.temperature,
      top_p: s.top_p, seed: s.seed, presence_penalty: 0.7, frequency_penalty: 0.4,
      logit_bias: { '101': 3, '32': -2 }, repetition_penalty: 1.3, min_tokens: 4,
    };
    const t = await client.completions.create(body);
    same('completion, ' + tag, want, t.choices[0].text);
    const ts = await client.completions.create(Object.assign({}, body, { stream: true }));
    let text = '';
    for await (const chunk of ts) {
      for (const ch of chunk.choices) {
        text += ch.text || '';
      }
    }
    same('streamed completion, ' + tag, want, text);
  }

  // logprobs through the SDK: one entry per token, each with its 2 best
  {
    const c = await client.chat.completions.create({
      model: modelName, messages: [{ role: 'user', content: prompt }], max_tokens: 6,
      temperature: 0, logprobs: true, top_logprobs: 2,
    });
    const content = c.choices[0].logprobs && c.choices[0].logprobs.content;
    if (!content || content.length !== c.usage.completion_tokens ||
        content.some((t) => t.top_logprobs.length !== 2 || !(t.logprob <= 0) ||
                            !Array.isArray(t.bytes))) {
      fail('chat logprobs: ' + JSON.stringify(c.choices[0].logprobs));
    }
    console.log('ok chat logprobs: ' + content.length + ' tokens, 2 alternatives each');
  }

  // nothing silently ignored: a refused field is the SDK's BadRequestError
  // naming it (param), an unknown one too
  for (const [extra, param] of [[{ tools: [{ type: 'function', function: { name: 'f' } }] },
                                 'tools'],
                                [{ response_format: { type: 'json_object' } }, 'response_format'],
                                [{ logprobs: true, top_logprobs: 1000 }, 'top_logprobs'],
                                [{ n: 17 }, 'n'],
                                [{ no_such_knob: 1 }, 'no_such_knob']]) {
    try {
      await client.chat.completions.create(Object.assign({
        model: modelName, messages: [{ role: 'user', content: 'x' }], max_tokens: 2 }, extra));
      fail('a request with ' + param + ' succeeded');
    } catch (e) {
      if (!(e instanceof OpenAI.BadRequestError) || e.status !== 400 || e.param !== param) {
        fail(param + ': ' + e + ' (status ' + e.status + ', param ' + e.param + ')');
      }
    }
  }
  console.log('ok refused fields -> BadRequestError 400 naming each');

  // a bad request: the router's OpenAI error becomes the SDK's APIError
  try {
    await client.chat.completions.create({ model: modelName, messages: [], max_tokens: 4 });
    fail('a chat request without messages succeeded');
  } catch (e) {
    if (!(e instanceof OpenAI.APIError) || e.status < 400 || e.status > 499 || !e.message) {
      fail('a chat request without messages: ' + e);
    }
    console.log('ok bad request -> APIError ' + e.status + ': ' + e.message);
  }
}

main().catch((e) => fail(e && e.stack ? e.stack : String(e)));
