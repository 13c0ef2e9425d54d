-- Rollout pause: hold at the current step (spec.paused).
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if obj.spec.paused == true then error("the Rollout is already paused (spec.paused)", 0) end
if phase == "Promoted" or phase == "Aborted" then
  error("the Rollout is " .. phase .. ": there is nothing left to pause", 0)
end
obj.spec.paused = true
return obj
