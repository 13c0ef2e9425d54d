-- Argo CD health of a sluice.dev Rollout (resource.customizations.health.sluice.dev_Rollout).
-- Reads only status; a status written for an older generation is still Progressing.
local hs = { status = "Progressing", message = "waiting for rollout-weights to report status" }
if obj.status == nil or obj.status.phase == nil then
  return hs
end
local st = obj.status
local generation = obj.metadata.generation or 0
if st.observedGeneration ~= nil and st.observedGeneration < generation then
  hs.message = "rollout-weights has not yet observed generation " .. generation
  return hs
end
local function condition(type_)
  for _, c in ipairs(st.conditions or {}) do
    if c.type == type_ then return c end
  end
  return nil
end
local function traffic()
  local parts = {}
  if st.currentStepIndex ~= nil then table.insert(parts, "step " .. st.currentStepIndex) end
  if st.desiredWeight ~= nil then table.insert(parts, "desired weight " .. st.desiredWeight .. "%") end
  if st.appliedShare ~= nil then
    -- One decimal without string.format or math.floor: Argo CD runs this without Lua's
    -- string and math libraries.
    local tenths = st.appliedShare * 1000 + 0.5
    tenths = tenths - tenths % 1
    table.insert(parts, "applied share " .. (tenths / 10) .. "%")
  end
  return table.concat(parts, ", ")
end
local phase = st.phase
if phase == "Invalid" then
  hs.status = "Degraded"
  local ready = condition("Ready")
  hs.message = "invalid spec: " .. ((ready and ready.message) or "see the Ready condition")
elseif phase == "Aborted" then
  hs.status = "Degraded"
  local reason = (st.abort and st.abort.reason) or "Unknown"
  hs.message = "aborted (" .. reason .. ")"
  if st.abort and st.abort.message then hs.message = hs.message .. ": " .. st.abort.message end
elseif phase == "Paused" then
  hs.status = "Suspended"
  hs.message = "paused at " .. traffic()
elseif phase == "Promoted" then
  hs.status = "Healthy"
  local overdue = condition("HandBackOverdue")
  if overdue and overdue.status == "True" then
    hs.message = "promoted; hand-back overdue: merge the change that makes the canary stable and deletes this Rollout"
  else
    hs.message = "promoted to 100% canary; waiting for hand-back"
  end
else
  hs.status = "Progressing"
  hs.message = phase .. ": " .. traffic()
end
return hs
