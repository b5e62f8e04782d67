-- One case of the load bench (benches/load.rs) for wrk, as issue 13 measured: the same
-- requests the bench's own client sends. Environment: CASE (http_read, http_write, mcp_read,
-- mcp_write, upstream), KEY (the agent key), SESSION (an MCP session id, if the server gave
-- one), PROTOCOL (the MCP protocol version). A write sends a fresh idempotency key per call.
local case = os.getenv("CASE")
local key = os.getenv("KEY") or ""
local session = os.getenv("SESSION") or ""
local protocol = os.getenv("PROTOCOL") or "2025-06-18"

local PROPOSAL = '{"tool":"lookup_order","version":1,"arguments":{"order_id":"ord_7Hq2Lm9Xv3"}}'
local WRITE_PROPOSAL = '{"tool":"create_support_credit","version":1,"arguments":'
  .. '{"customer_id":"cus_load0000001","amount_cents":1200,"reason":"load test"}}'
local ARGUMENTS = '{"order_id":"ord_7Hq2Lm9Xv3"}'
local WRITE_ARGUMENTS = '{"customer_id":"cus_load0000001","amount_cents":1200,"reason":"load test"}'

local calls = 0
-- Distinct across wrk's runs: the keys of one run are never those of another.
local run = tostring(os.time()) .. "-" .. tostring(math.random(1, 1000000000))

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. key
if case == "upstream" then
  wrk.path = "/orders"
  wrk.body = ARGUMENTS
elseif case == "http_read" then
  wrk.path = "/v1/proposals"
  wrk.body = PROPOSAL
elseif case == "mcp_read" or case == "mcp_write" then
  wrk.path = "/mcp"
  wrk.headers["Accept"] = "application/json, text/event-stream"
  wrk.headers["MCP-Protocol-Version"] = protocol
  if session ~= "" then
    wrk.headers["Mcp-Session-Id"] = session
  end
end

request = function()
  calls = calls + 1
  if case == "http_write" then
    -- wrk.format's headers replace wrk.headers: the common ones are copied in.
    local headers = { ["Idempotency-Key"] = "wrk-" .. run .. "-" .. calls }
    for name, value in pairs(wrk.headers) do
      headers[name] = value
    end
    return wrk.format("POST", "/v1/proposals", headers, WRITE_PROPOSAL)
  elseif case == "mcp_read" then
    return wrk.format(nil, nil, nil, '{"jsonrpc":"2.0","id":' .. calls
      .. ',"method":"tools/call","params":{"name":"lookup_order","arguments":' .. ARGUMENTS .. '}}')
  elseif case == "mcp_write" then
    return wrk.format(nil, nil, nil, '{"jsonrpc":"2.0","id":' .. calls
      .. ',"method":"tools/call","params":{"name":"create_support_credit","arguments":' .. WRITE_ARGUMENTS
      .. ',"_meta":{"io.warrant/idempotency_key":"wrk-' .. run .. '-' .. calls .. '"}}}')
  end
  return wrk.format()
end

-- An answer that is not a committed call (a refusal inside a 200, an MCP `isError`, an
-- `unknown` 202) is not a call the server did: counted as an error, as the bench's own client
-- counts only committed results. Every lane writes its outcome as `…outcome":"committed"`.
-- A global: `thread:get` reads a thread's globals.
uncommitted = 0
if case ~= "upstream" then
  response = function(status, headers, body)
    if not body or not body:find('outcome":"committed"', 1, true) then
      uncommitted = uncommitted + 1
    end
  end
end

-- `done` runs in wrk's main Lua state, not in the threads': each thread's count is read back.
local threads = {}
setup = function(thread)
  table.insert(threads, thread)
end

done = function(summary, latency, requests)
  local e = summary.errors
  local not_committed = 0
  for _, thread in ipairs(threads) do
    not_committed = not_committed + (thread:get("uncommitted") or 0)
  end
  io.write(string.format("WRK calls=%d us=%d p50=%.3f p99=%.3f max=%.3f errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, e.connect + e.read + e.write + e.status + e.timeout + not_committed))
end
