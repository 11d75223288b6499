"""Clients of dsc serve for tests/cli/serve.sh (loopback only).

  serve_client.py URL concurrent N   N mixed requests at once (completions and
                                     chat, streamed and whole, greedy and
                                     seeded sampling, prompts and lengths of
                                     every size), then each alone: every
                                     answer must equal its answer alone
  serve_client.py URL openai         the openai package's client: models,
                                     completions and chat, whole and streamed
  serve_client.py URL errors         bad requests: each a 4xx with a JSON error
  serve_client.py URL disconnect N   clients that leave mid-answer (asking for N
                                     tokens) free their slots
  serve_client.py URL complete TEXT N  a greedy completion's text, to standard output

Exit 0 when every check held; each failure prints a line.
"""
import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


class Server:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port

    def request(self, method, path, body=None, raw=None, timeout=300):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode("utf-8")
        c.close()
        return r.status, r.getheader("Content-Type"), text

    def post(self, path, body):
        status, ctype, text = self.request("POST", path, body)
        if body.get("stream"):
            return status, self.parse_stream(text, path.endswith("chat/completions"))
        return status, json.loads(text)

    @staticmethod
    def parse_stream(text, chat):
        """The events of a streamed answer as the answer they add up to."""
        events = [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return {"error": "stream did not end with [DONE]: " + text[-200:]}
        out, finish, usage = "", None, None
        for e in events[:-1]:
            j = json.loads(e)
            ch = j["choices"][0]
            out += (ch["delta"].get("content") or "") if chat else ch["text"]
            finish = ch["finish_reason"] or finish
            usage = j.get("usage") or usage
        return {"text": out, "finish_reason": finish, "usage": usage}

    def metrics(self):
        _, _, text = self.request("GET", "/metrics")
        m = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                m[k] = float(v)
        return m


def answer_of(path, status, j):
    """(text, finish_reason, completion_tokens) of a 200 answer."""
    if status != 200 or "error" in j:
        return ("HTTP %d %s" % (status, j), None, None)
    if "choices" not in j:  # a parsed stream
        return (j["text"], j["finish_reason"], j["usage"]["completion_tokens"])
    ch = j["choices"][0]
    text = ch["message"]["content"] if path.endswith("chat/completions") else ch["text"]
    return (text, ch["finish_reason"], j["usage"]["completion_tokens"])


def mixed_requests(n, context, seed=5):
    rng = random.Random(seed)
    words = "the cat sat on a mat and then it ran far away from the dog".split()
    reqs = []
    for i in range(n):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))[: rng.randint(1, 40)]
        chat = i % 4 == 3
        body = {"max_tokens": rng.randint(1, 20)}
        if chat:
            body["messages"] = [{"role": "user", "content": text[:20]}]
        else:
            body["prompt"] = text
        if i % 3 == 0:
            body["temperature"] = 0
        else:
            body.update(temperature=rng.choice([0.7, 1.0, 1.3]), seed=rng.randint(0, 2**31))
            if i % 5 == 1:
                body["top_p"] = 0.9
            if i % 7 == 2:
                body["top_k"] = 8
        if i % 2 == 1:
            body["stream"] = True
        if i % 11 == 4:
            body["stop"] = ["e", "zz"]
        path = "/v1/chat/completions" if chat else "/v1/completions"
        reqs.append((path, body))
    return reqs


def concurrent(server, n):
    reqs = mixed_requests(n, 64)
    together = [None] * n
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait()
        path, body = reqs[i]
        together[i] = answer_of(path, *server.post(path, body))

    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    t_together = time.time() - t0
    m = server.metrics()
    check(m["dsc_requests_running"] == 0 and m["dsc_requests_queued"] == 0,
          "requests left running after all answers: %s" % m)
    t0 = time.time()
    for i, (path, body) in enumerate(reqs):
        alone = answer_of(path, *server.post(path, body))
        check(together[i] == alone,
              "request %d %s: together %r, alone %r" % (i, json.dumps(body), together[i], alone))
        check(alone[1] in ("length", "stop"), "request %d finished with %r" % (i, alone[1]))
    t_alone = time.time() - t0
    streamed = sum(1 for _, b in reqs if b.get("stream"))
    print("concurrent: %d requests (%d streamed, %d chat) together in %.2f s, one at a time in %.2f s;"
          " %d answers equal alone" % (n, streamed, sum(1 for p, _ in reqs if "chat" in p),
                                       t_together, t_alone, n - len(failures)))


def with_openai(server, model):
    import openai
    client = openai.OpenAI(base_url="http://%s:%d/v1" % (server.host, server.port), api_key="none")
    ids = [m.id for m in client.models.list().data]
    check(ids == [model], "models: %r" % ids)
    c = client.completions.create(model=model, prompt="the cat", max_tokens=12, temperature=0)
    check(c.object == "text_completion" and len(c.choices) == 1, "completion: %r" % c)
    check(c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 12,
          "completion usage: %r" % c.usage)
    check(c.usage.prompt_tokens == len("the cat"), "prompt tokens: %r" % c.usage)
    parts = list(client.completions.create(model=model, prompt="the cat", max_tokens=12,
                                           temperature=0, stream=True))
    check("".join(p.choices[0].text for p in parts) == c.choices[0].text,
          "streamed completion differs: %r" % parts)
    check(parts[-1].choices[0].finish_reason == "length", "stream finish: %r" % parts[-1])
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a mat"}]
    ch = client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0.9,
                                        seed=42, top_p=0.95)
    check(ch.object == "chat.completion" and ch.choices[0].message.role == "assistant",
          "chat: %r" % ch)
    chunks = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=10,
                                                 temperature=0.9, seed=42, top_p=0.95, stream=True))
    text = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices)
    check(text == ch.choices[0].message.content, "streamed chat %r, whole %r" % (text, ch))
    check(chunks[0].choices[0].delta.role == "assistant", "first chunk: %r" % chunks[0])
    try:
        client.completions.create(model=model, prompt="x" * 70, max_tokens=5)
        check(False, "a prompt over the context was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "context" in str(e), "over the context: %r" % e)
    try:
        client.completions.create(model="other", prompt="x", max_tokens=5)
        check(False, "another model's name was accepted")
    except openai.BadRequestError as e:
        check("not served here" in str(e), "model name: %r" % e)
    print("openai %s: models, completions, chat, streamed and whole, errors" % openai.__version__)


def errors(server):
    cases = [
        ("POST", "/v1/completions", '{"prompt": "x"', 400, "not valid JSON"),
        ("POST", "/v1/completions", "[1, 2]", 400, "must be a JSON object"),
        ("POST", "/v1/completions", '{"prompt": "x", "logit_bias": {}}', 400, "unknown field 'logit_bias'"),
        ("POST", "/v1/completions", '{"prompt": "x", "messages": []}', 400, "unknown field 'messages'"),
        ("POST", "/v1/chat/completions", '{"prompt": "x"}', 400, "unknown field 'prompt'"),
        ("POST", "/v1/completions", '{}', 400, "'prompt' must be"),
        ("POST", "/v1/completions", '{"prompt": ""}', 400, "the prompt is empty"),
        ("POST", "/v1/completions", '{"prompt": ["a", "b"]}', 400, "'prompt' must be"),
        ("POST", "/v1/completions", '{"prompt": [1, 999]}', 400, "not a token id"),
        ("POST", "/v1/completions", '{"prompt": "x", "max_tokens": 0}', 400, "'max_tokens' must be"),
        ("POST", "/v1/completions", '{"prompt": "x", "max_tokens": 1.5}', 400, "'max_tokens' must be"),
        ("POST", "/v1/completions", '{"prompt": "x", "temperature": -1}', 400, "'temperature' must be"),
        ("POST", "/v1/completions", '{"prompt": "x", "top_p": 0}', 400, "'top_p' must be"),
        ("POST", "/v1/completions", '{"prompt": "x", "n": 2}', 400, "'n' must be"),
        ("POST", "/v1/completions", '{"prompt": "x", "stream": "yes"}', 400, "'stream' must be"),
        ("POST", "/v1/completions", '{"prompt": "x", "stop": 3}', 400, "'stop' must be"),
        ("POST", "/v1/completions", '{"prompt": "x", "stop": ["a","b","c","d","e"]}', 400, "'stop' must be"),
        ("POST", "/v1/completions", '{"prompt": "%s", "max_tokens": 10}' % ("y" * 60), 400,
         "context is 64 tokens, but 70 were asked for"),
        ("POST", "/v1/chat/completions", '{"messages": [{"role": "robot", "content": "x"}]}', 400, "'role' must be"),
        ("POST", "/v1/chat/completions", '{"messages": "hi"}', 400, "'messages' must be"),
        ("GET", "/v1/completions", None, 405, "takes POST"),
        ("POST", "/health", "{}", 405, "takes GET"),
        ("GET", "/v2/nothing", None, 404, "no such endpoint"),
        ("POST", "/v1/completions", "x" * ((1 << 20) + 1), 413, "over"),
    ]
    for method, path, raw, code, want in cases:
        status, ctype, text = server.request(method, path, raw=raw)
        try:
            j = json.loads(text)
            msg = j["error"]["message"]
            ok = status == code and want in msg and ctype == "application/json"
        except (ValueError, KeyError):
            ok, msg = False, text
        check(ok, "%s %s %r: want %d '%s', got %d %r" % (method, path, (raw or "")[:60], code, want,
                                                          status, msg[:200]))
    status, _, text = server.request("POST", "/v1/completions",
                                     raw='{"prompt": "%s", "max_tokens": 10}' % ("y" * 60))
    check(json.loads(text)["error"]["code"] == "context_length_exceeded", "code: " + text)
    status, ctype, text = server.request("GET", "/health")
    check(status == 200 and json.loads(text) == {"status": "ok"}, "health: %d %s" % (status, text))
    m = server.metrics()
    check(m['dsc_request_errors_total{class="4xx"}'] >= len(cases), "4xx count: %r" % m)
    print("errors: %d bad requests, each a 4xx with its message" % len(cases))


def disconnect(server, max_tokens):
    before = server.metrics()
    for stream in (True, False):
        s = socket.create_connection((server.host, server.port), timeout=60)
        body = json.dumps({"prompt": "a", "max_tokens": max_tokens, "temperature": 1.0, "seed": 3,
                           "stream": stream})
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        if stream:  # the headers and a first piece of text: it runs
            got = b""
            while b'"text"' not in got:
                more = s.recv(4096)
                if not more:
                    break
                got += more
            check(got.startswith(b"HTTP/1.1 200") and b'"text"' in got, "stream start: %r" % got)
        else:  # wait until it holds a slot
            for _ in range(600):
                if server.metrics()["dsc_requests_running"] >= 1:
                    break
                time.sleep(0.005)
        s.close()
        for _ in range(600):
            m = server.metrics()
            if m["dsc_requests_running"] == 0 and m["dsc_requests_queued"] == 0:
                break
            time.sleep(0.05)
        check(m["dsc_requests_running"] == 0, "a slot stays taken after its client left: %r" % m)
    after = server.metrics()
    gone = after["dsc_client_disconnects_total"] - before["dsc_client_disconnects_total"]
    made = after["dsc_generation_tokens_total"] - before["dsc_generation_tokens_total"]
    check(gone == 2, "disconnects counted: %d" % gone)
    check(1 <= made < max_tokens, "tokens generated for clients that left: %d of %d" % (made, 2 * max_tokens))
    print("disconnect: 2 clients left mid-answer; %d of %d tokens generated, slots free"
          % (made, 2 * max_tokens))


def main():
    server = Server(sys.argv[1])
    mode = sys.argv[2]
    if mode == "concurrent":
        concurrent(server, int(sys.argv[3]))
    elif mode == "openai":
        with_openai(server, sys.argv[3])
    elif mode == "errors":
        errors(server)
    elif mode == "disconnect":
        disconnect(server, int(sys.argv[3]))
    elif mode == "complete":
        status, j = server.post("/v1/completions", {"prompt": sys.argv[3], "max_tokens": int(sys.argv[4]),
                                                    "temperature": 0})
        check(status == 200, "complete: %d %r" % (status, j))
        sys.stdout.write(j["choices"][0]["text"] if status == 200 else "")
    else:
        sys.exit("unknown mode " + mode)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
