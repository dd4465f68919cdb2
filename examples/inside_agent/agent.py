"""A small coding agent that runs inside its sandbox, on the sandbox's own python3 and nothing else.

It asks the policy what to do through the OpenAI API at OPENAI_BASE_URL with OPENAI_API_KEY (the sandbox's model
gateway puts both in its environment), runs the bash commands the policy calls for in the repository, gives it
their output, and stops when the policy answers without a tool call (or after MAX_TURNS). It asks for token ids
and log-probabilities, which a vLLM server returns and the gateway records for the trainer.
"""

import json
import os
import subprocess
import urllib.request

MAX_TURNS = 8
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Runs a bash command in the repository and returns its exit code and output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def ask(messages):
    body = {"model": os.environ.get("POLICY_MODEL", "policy"), "messages": messages, "tools": TOOLS,
            "seed": int(os.environ.get("SEED", "0")), "logprobs": True, "return_token_ids": True}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.load(answer)["choices"][0]["message"]


def main():
    messages = [{"role": "system", "content": "You fix bugs. Use the bash tool; answer without it when done."},
                {"role": "user", "content": os.environ["TASK"]}]
    for turn in range(MAX_TURNS):
        message = ask(messages)
        messages.append(message)
        calls = message.get("tool_calls") or []
        print(f"turn {turn}: {message.get('content') or ''} {len(calls)} tool call(s)", flush=True)
        if not calls:
            return
        for call in calls:
            command = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
            output = f"exit code {done.returncode}\n{done.stdout}{done.stderr}"[-4000:]
            print(f"$ {command}\n{output}", flush=True)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})


if __name__ == "__main__":
    main()
