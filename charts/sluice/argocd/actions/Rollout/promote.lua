-- Rollout promote: complete the current step now (spec.promoteThroughStep = the current step).
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if phase == "Promoted" then error("the Rollout is already promoted: nothing to promote", 0) end
if phase == "Aborted" then error("the Rollout is aborted: retry it before promoting", 0) end
if phase == "Invalid" then error("the Rollout has an invalid spec: fix it before promoting", 0) end
local step = nil
if obj.status ~= nil then step = obj.status.currentStepIndex end
if step == nil then
  error("the Rollout has not started a step yet: wait for it, or use promote-full", 0)
end
local through = obj.spec.promoteThroughStep
if through ~= nil and through >= step then
  error("the Rollout is already promoted through step " .. through .. ": wait for rollout-weights, or use promote-full", 0)
end
obj.spec.promoteThroughStep = step
return obj
