-- Argo CD health of a sluice.dev BundlePin (resource.customizations.health.sluice.dev_BundlePin).
-- A pin that holds is Healthy: it is the state asked for (its age is alerted on, not its health).
local hs = { status = "Progressing", message = "waiting for revert to report status" }
if obj.status == nil or obj.status.phase == nil then
  return hs
end
local st = obj.status
local generation = obj.metadata.generation or 0
if st.observedGeneration ~= nil and st.observedGeneration < generation then
  hs.message = "revert has not yet observed generation " .. generation
  return hs
end
local function condition(type_)
  for _, c in ipairs(st.conditions or {}) do
    if c.type == type_ then return c end
  end
  return nil
end
local apps = 0
for _ in ipairs(st.applications or {}) do apps = apps + 1 end
local phase = st.phase
if phase == "Pinned" then
  hs.status = "Healthy"
  hs.message = apps .. " application(s) pinned to " .. (st.toDigest or "?")
elseif phase == "Released" then
  hs.status = "Healthy"
  hs.message = "released"
elseif phase == "Refused" or phase == "Failed" then
  hs.status = "Degraded"
  local why = condition("Verified")
  if why == nil or why.status ~= "False" then why = condition("Pinned") end
  if why == nil or why.status ~= "False" then why = condition("Ready") end
  -- Argo CD runs this without Lua's string library (no string.lower).
  local word = ({ Refused = "refused", Failed = "failed" })[phase]
  hs.message = word .. ": " .. ((why and why.message) or "see the conditions")
else
  hs.status = "Progressing"
  hs.message = phase
end
return hs
