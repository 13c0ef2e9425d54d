-- Argo CD health of a sluice.dev WaveGate (resource.customizations.health.sluice.dev_WaveGate).
-- Reads only status; a status written for an older generation is still Progressing.
local hs = { status = "Progressing", message = "waiting for wave-gate to report status" }
if obj.status == nil or obj.status.phase == nil then
  return hs
end
local st = obj.status
local generation = obj.metadata.generation or 0
if st.observedGeneration ~= nil and st.observedGeneration < generation then
  hs.message = "wave-gate has not yet observed generation " .. generation
  return hs
end
local function condition(type_)
  for _, c in ipairs(st.conditions or {}) do
    if c.type == type_ then return c end
  end
  return nil
end
local ready = condition("Ready")
if ready and ready.status == "False" and ready.reason == "InvalidSpec" then
  hs.status = "Degraded"
  hs.message = "invalid spec: " .. (ready.message or "see the Ready condition")
  return hs
end
local revision = st.currentRevision or "no revision"
local phase = st.phase
if phase == "Complete" then
  hs.status = "Healthy"
  hs.message = "every wave passed at " .. revision
elseif phase == "Halted" then
  hs.status = "Degraded"
  local halt = st.halt or {}
  hs.message = "halted in wave " .. (halt.wave or "?") .. " (" .. (halt.reason or "Unknown") .. ")"
  if halt.message then hs.message = hs.message .. ": " .. halt.message end
elseif phase == "Refused" then
  hs.status = "Degraded"
  local safe = condition("ApplicationSetSafe")
  hs.message = "refused: " .. ((safe and safe.message) or (ready and ready.message) or "see the conditions")
else
  hs.status = "Progressing"
  hs.message = phase .. ": " .. revision
  if st.currentWave then hs.message = hs.message .. ", wave " .. st.currentWave end
end
return hs
