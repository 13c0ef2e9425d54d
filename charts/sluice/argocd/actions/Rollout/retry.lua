-- Rollout retry: start an aborted Rollout again from the first step (spec.retry raised past
-- status.retriesHandled, spec.abort cleared, and the aborted attempt's manual promotion
-- dropped so it cannot skip steps of the new one).
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if phase ~= "Aborted" and obj.spec.abort ~= true then
  error("the Rollout is " .. phase .. ", not aborted: there is nothing to retry", 0)
end
local retry = obj.spec.retry or 0
if obj.status ~= nil and obj.status.retriesHandled ~= nil and obj.status.retriesHandled > retry then
  retry = obj.status.retriesHandled
end
obj.spec.abort = false
obj.spec.retry = retry + 1
obj.spec.promoteFull = false
obj.spec.promoteThroughStep = nil
return obj
