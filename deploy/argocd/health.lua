-- Argo CD health check for the forkd.dev kinds (ForkParent, ForkLayer, ForkPool, ForkBranch, ForkClaim).
-- Reads the conditions the forkd operator copies from the node daemon: Stalled or Degraded True -> Degraded,
-- Ready True -> Healthy, anything else (no status yet, an older generation observed, Ready False/Unknown)
-- -> Progressing. Installed by deploy/argocd/argocd-cm.yaml; tested by tests/test_deploy.py (lupa).
local hs = {status = "Progressing", message = "waiting for the forkd operator to report status"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.message = "the node has not reconciled generation " .. tostring(generation) .. " yet"
  return hs
end
local found = {}
for _, c in ipairs(obj.status.conditions) do
  found[c.type] = c
end
for _, kind in ipairs({"Stalled", "Degraded"}) do
  local c = found[kind]
  if c ~= nil and c.status == "True" then
    hs.status = "Degraded"
    hs.message = kind .. ": " .. (c.reason or "") .. ": " .. (c.message or "")
    return hs
  end
end
local ready = found["Ready"]
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end
if ready ~= nil then
  hs.message = (ready.reason or "NotReady") .. ": " .. (ready.message or "")
end
return hs
