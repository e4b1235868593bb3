#!/bin/bash
# Reasoning and tool calls in chat replies (gateway/chatout.h) on the fake
# echo engine: the byte codec with a template that is the last user
# message makes the "model" write exactly the text a test sends.  The round
# trips against the real Qwen chat templates and the official openai client
# are tests/node/serve_tools.mjs; here the request checks and the edges.
. "$(dirname "$0")/lib/serve.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIX=$(cd "${MEMRA_FIXTURES:-$ROOT/../shared/fixtures}" && pwd)
if [ ! -d "$ROOT/tests/node/node_modules/openai" ]; then
    echo "FAIL: tests/node/node_modules/openai is missing (run make deps)"
    exit 1
fi
cat > "$T/tmpl.json" <<'J'
{"listen": "127.0.0.1:@PORT@", "supervise": true, "worker_bin": "@BIN@/memra-worker",
 "models": [
  {"name": "qwen3", "tokenizer": "bytes", "backend": "fake", "chat_template": "{{ messages[-1].content }}",
   "reasoning_parser": "think", "tool_parser": "hermes", "context_length": 8192,
   "workers": [{"listen": "ipc://@T@/t0.sock"}], "worker_args": ["--fake-delay-ms", "0"]},
  {"name": "qwen35", "tokenizer": "bytes", "backend": "fake", "chat_template": "{{ messages[-1].content }}<think>\n",
   "reasoning_parser": "think", "tool_parser": "qwen3_xml", "context_length": 8192,
   "workers": [{"listen": "ipc://@T@/t1.sock"}], "worker_args": ["--fake-delay-ms", "0"]},
  {"name": "coder", "tokenizer": "bytes", "backend": "fake", "chat_template": "{{ messages[-1].content }}",
   "reasoning_parser": "none", "tool_parser": "qwen3_xml", "context_length": 8192,
   "workers": [{"listen": "ipc://@T@/t2.sock"}], "worker_args": ["--fake-delay-ms", "0"]}]}
J
start_gateway "$T/tmpl.json" "$T/gw.log"
check "ready" wait_ready 10

TOOLS='[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}]'
chat() { # MODEL CONTENT [extra fields]
    local c
    c=$(jq -Rs . <<<"$2" | sed 's/\\n"$/"/')
    post /v1/chat/completions "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":$c}],\"max_tokens\":2000,\"stop\":[\"@@\"]${3:+,$3}}"
}

# requests the server cannot honour are refused, naming the parameter
refused() { # DESCRIPTION FIELDS PARAM
    chat qwen3 'x' "$2"
    check "$1: 400 naming $3" bash -c "[ $CODE = 400 ] && jq -e --arg p '$3' '.error.param == \$p' '$T/out' >/dev/null"
}
# tool_choice "required" and a named function are kept by a grammar in the
# model's tool-call format (tests/node/serve_structured.mjs checks what a
# model then writes, tests/node/toolgram_check.mjs the grammars' sentences);
# a call needs tools to call
refused "tool_choice required without tools" '"tool_choice":"required"' tool_choice
refused "tool_choice naming a function not in tools" "\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}" tool_choice
refused "tool_choice neither a mode nor a function" "\"tools\":$TOOLS,\"tool_choice\":\"always\"" tool_choice
chat coder 'x@@' "\"tools\":$TOOLS,\"tool_choice\":\"required\""
check "tool_choice required in the qwen3_xml format is accepted" [ "$CODE" = 200 ]
chat coder 'x' "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":3}}}}}],\"tool_choice\":\"required\""
check "a string keyword the XML form cannot keep: 400 naming tool_choice" bash -c "[ $CODE = 400 ] && jq -e '.error.param == \"tool_choice\" and (.error.message | test(\"maxLength\"))' '$T/out' >/dev/null"
chat qwen3 'x@@' "\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"
check "tool_choice naming f in the hermes format is accepted" [ "$CODE" = 200 ]
refused "a tool without a name" '"tools":[{"type":"function","function":{"description":"no name"}}]' tools
refused "tools not an array" '"tools":{"type":"function"}' tools
refused "parallel_tool_calls not a boolean" '"parallel_tool_calls":"yes"' parallel_tool_calls
refused "response_format of an unknown type" '"response_format":{"type":"yaml"}' response_format
refused "response_format json_schema with a schema that is not an object" '"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":[1]}}' response_format
refused "grammar that does not parse" '"grammar":"root ::= ("' grammar
chat qwen3 'x@@' '"response_format":{"type":"json_object"}'
check "response_format json_object is accepted" [ "$CODE" = 200 ]
chat qwen35 'x@@' '"response_format":{"type":"json_object"}'
check "a grammar where the template always opens <think>: 400 naming response_format" bash -c "[ $CODE = 400 ] && jq -e '.error.param == \"response_format\"' '$T/out' >/dev/null"
chat qwen3 'x@@' '"response_format":{"type":"text"}'
check "response_format text is accepted" [ "$CODE" = 200 ]
refused "reasoning_effort outside its levels" '"reasoning_effort":"extreme"' reasoning_effort
chat qwen3 'x@@' '"reasoning_effort":"none"'
check "reasoning_effort none is accepted" [ "$CODE" = 200 ]
post /v1/chat/completions '{"model":"qwen3","messages":[{"role":"user","content":"x","tool_calls":[]}]}'
check "tool_calls on a user message: 400" bash -c "[ $CODE = 400 ] && jq -e '.error.param == \"messages\"' '$T/out' >/dev/null"
post /v1/chat/completions '{"model":"qwen3","messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","content":"2"},{"role":"user","content":"y"}],"max_tokens":1}'
check "a tool round in the history is accepted" [ "$CODE" = 200 ]

# reasoning is split off; include_reasoning false drops it
chat qwen3 $'<think>\nwhy\n</think>\n\nanswer@@'
check "reasoning_content and content" jqo '.choices[0].message == {"role":"assistant","content":"answer","reasoning_content":"why"} and .choices[0].finish_reason == "stop"'
chat qwen3 $'<think>\nwhy\n</think>\n\nanswer@@' '"include_reasoning":false'
check "include_reasoning false" jqo '.choices[0].message == {"role":"assistant","content":"answer"}'
chat qwen3 $'no reasoning here <think>x</think>@@'
check "a <think> inside the answer is text" jqo '.choices[0].message.content == "no reasoning here <think>x</think>" and (.choices[0].message | has("reasoning_content") | not)'
chat coder $'<think>\nwhy\n</think>\n\nanswer@@'
check "reasoning_parser none keeps the text" jqo '.choices[0].message.content == "<think>\nwhy\n</think>\n\nanswer"'
# a reply cut inside its reasoning: all of it is reasoning, content is empty
post /v1/chat/completions '{"model":"qwen35","messages":[{"role":"user","content":"still thinking about it"}],"max_tokens":8}'
check "cut inside the reasoning (opened by the prompt)" jqo '.choices[0].message == {"role":"assistant","content":"","reasoning_content":"still th"} and .choices[0].finish_reason == "length"'

# tool calls: without tools in the request the markers are text; a call
# that does not parse, or one cut off, comes back as text
CALL=$'<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
chat qwen3 "$CALL@@"
check "no tools in the request: the call is text" jqo --arg c "$CALL" '.choices[0].message.content == $c and .choices[0].finish_reason == "stop"'
chat qwen3 "$CALL@@" "\"tools\":$TOOLS"
check "a call" jqo '.choices[0].message.content == null and (.choices[0].message.tool_calls | length == 1) and .choices[0].message.tool_calls[0].function == {"name":"f","arguments":"{\"a\":1}"} and .choices[0].finish_reason == "tool_calls"'
chat qwen3 $'<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>@@' "\"tools\":$TOOLS"
check "malformed JSON: the text is content" jqo '.choices[0].message.content == "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>" and (.choices[0].message | has("tool_calls") | not) and .choices[0].finish_reason == "stop"'
post /v1/chat/completions "{\"model\":\"qwen3\",\"messages\":[{\"role\":\"user\",\"content\":$(jq -Rs . <<<"$CALL")}],\"max_tokens\":20,\"tools\":$TOOLS}"
check "cut by max_tokens inside a call: text, finish length" jqo --arg c "${CALL:0:20}" '.choices[0].message.content == $c and .choices[0].finish_reason == "length"'
chat qwen35 $'r</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\n7\n</parameter>\n</function>\n</tool_call>@@' "\"tools\":$TOOLS"
check "XML call, integer typed by the schema" jqo '.choices[0].message.reasoning_content == "r" and .choices[0].message.tool_calls[0].function == {"name":"f","arguments":"{\"a\":7}"}'
chat qwen35 $'r</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\nseven\n</parameter>\n</function>\n</tool_call>@@' "\"tools\":$TOOLS"
check "XML call, a value that is not its type stays text" jqo '.choices[0].message.tool_calls[0].function.arguments == "{\"a\":\"seven\"}"'

# streamed: the same pieces as deltas, and stream == blocking
S=$'<think>\nwhy\n</think>\n\nanswer\n<tool_call>\n{"name": "f", "arguments": {"a": 2}}\n</tool_call>@@'
chat qwen3 "$S" "\"tools\":$TOOLS,\"stream\":true"
cp "$T/out" "$T/s1"
check "stream well-formed" sse_wellformed "$T/s1"
check "stream: reasoning, content, one call, finish tool_calls" bash -c "grep '^data: {' '$T/s1' | sed 's/^data: //' | jq -se '
  ([.[].choices[0].delta.reasoning_content // empty] | join(\"\")) == \"why\" and
  ([.[].choices[0].delta.content // empty] | join(\"\")) == \"answer\" and
  ([.[].choices[0].delta.tool_calls // empty | .[]] | length == 2 and .[0].index == 0 and .[0].function.name == \"f\" and .[0].function.arguments == \"\" and .[1].function.arguments == \"{\\\"a\\\":2}\") and
  ([.[].choices[0].finish_reason // empty] == [\"tool_calls\"])' >/dev/null"

check "round trips through the real templates (openai client)" timeout 120 node "$ROOT/tests/node/serve_tools.mjs" "$URL" "$FIX/templates"
check "tool-call grammars' sentences read back as valid calls (ajv)" timeout 300 node "$ROOT/tests/node/toolgram_check.mjs" "$URL" "$MEMRA_BIN/schema-grammar"
finish
