-- wrk script of bench/proxy.py: every request is a POST of the JSON body in $BENCH_BODY.
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY") or '{"model":"json-model","messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"
if os.getenv("BENCH_BEARER") then
  wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_BEARER")  -- auth.mode: keys
end
