-- Argo CD health of a sluice.dev RevisionUpgrade
-- (resource.customizations.health.sluice.dev_RevisionUpgrade). Progress counts proxies by the
-- revision their injector recorded, as the status reports them.
local hs = { status = "Progressing", message = "waiting for upgrade-revisions to report status" }
if obj.status == nil or obj.status.phase == nil then
  return hs
end
local st = obj.status
local generation = obj.metadata.generation or 0
if st.observedGeneration ~= nil and st.observedGeneration < generation then
  hs.message = "upgrade-revisions has not yet observed generation " .. generation
  return hs
end
local function condition(type_)
  for _, c in ipairs(st.conditions or {}) do
    if c.type == type_ then return c end
  end
  return nil
end
local function proxies()
  local p = st.proxies
  if p == nil then return "no proxy count yet" end
  return (p.new or 0) .. " proxies on the new revision, " .. (p.old or 0) .. " on the old"
end
local phase = st.phase
if phase == "Complete" then
  hs.status = "Healthy"
  hs.message = "complete: " .. proxies()
elseif phase == "Paused" then
  hs.status = "Suspended"
  hs.message = "paused: " .. proxies()
elseif phase == "Aborted" or phase == "Invalid" then
  hs.status = "Degraded"
  local ready = condition("Ready")
  local detail = (ready and ready.status == "False" and ready.message) or proxies()
  -- Argo CD runs this without Lua's string library (no string.lower).
  local word = ({ Aborted = "aborted", Invalid = "invalid" })[phase]
  hs.message = word .. ": " .. detail
else
  hs.status = "Progressing"
  hs.message = phase
  if st.currentWave then hs.message = hs.message .. " wave " .. st.currentWave end
  hs.message = hs.message .. ": " .. proxies()
end
return hs
