-- RevisionUpgrade abort: moved namespaces are retagged back and restarted, paced (spec.abort).
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if phase == "Complete" then
  error("the RevisionUpgrade is complete: nothing to abort (retag namespaces with a new RevisionUpgrade)", 0)
end
if obj.spec.abort == true then error("the RevisionUpgrade is already aborted (spec.abort)", 0) end
obj.spec.abort = true
return obj
