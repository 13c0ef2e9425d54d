-- RevisionUpgrade resume: continue after a pause (spec.paused = false) or, after an abort, move
-- forward again (spec.abort cleared and spec.resume raised past status.resumesHandled).
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
local aborted = obj.spec.abort == true or phase == "Aborted" or phase == "RollingBack"
if not aborted and obj.spec.paused ~= true and phase ~= "Paused" then
  error("the RevisionUpgrade is neither paused nor aborted", 0)
end
obj.spec.paused = false
if aborted then
  local resume = obj.spec.resume or 0
  if obj.status ~= nil and obj.status.resumesHandled ~= nil and obj.status.resumesHandled > resume then
    resume = obj.status.resumesHandled
  end
  obj.spec.abort = false
  obj.spec.resume = resume + 1
end
return obj
