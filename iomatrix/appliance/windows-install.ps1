# iomatrix: run once, as Administrator, in the Windows guest with the seed (the CD labelled
# @SEED_LABEL@) attached: registers the scheduled task that runs the seed's iomatrix.ps1 at every
# boot as SYSTEM, and lets the host's fio client reach fio's server on TCP port @PORT@.
$ErrorActionPreference = 'Stop'
$command = "`$v = Get-Volume -FileSystemLabel '@SEED_LABEL@' | Where-Object DriveLetter | Select-Object -First 1; " +
           "if (`$v) { & (`$v.DriveLetter + ':\iomatrix.ps1') }"
$action = New-ScheduledTaskAction -Execute 'powershell.exe' `
    -Argument ('-NoProfile -NonInteractive -ExecutionPolicy Bypass -Command "' + $command + '"')
$trigger = New-ScheduledTaskTrigger -AtStartup
$principal = New-ScheduledTaskPrincipal -UserId 'SYSTEM' -LogonType ServiceAccount -RunLevel Highest
$settings = New-ScheduledTaskSettingsSet -ExecutionTimeLimit ([TimeSpan]::Zero) -AllowStartIfOnBatteries
Register-ScheduledTask -TaskName 'iomatrix' -Action $action -Trigger $trigger -Principal $principal `
    -Settings $settings -Force | Out-Null
if (-not (Get-NetFirewallRule -DisplayName 'iomatrix fio' -ErrorAction SilentlyContinue)) {
    New-NetFirewallRule -DisplayName 'iomatrix fio' -Direction Inbound -Protocol TCP -LocalPort @PORT@ `
        -Action Allow | Out-Null
}
Write-Output 'iomatrix: the task is registered; shut Windows down (the image is then ready).'
