# disk_line NAME: the line that describes /sys/block/NAME to the host (its size, queues,
# scheduler, rotational flag, driver and model), which build.parse_disk_lines reads; shared by the
# appliance's init and a user's guest's seed script.
disk_line() {
    q=/sys/block/$1/queue
    queues=$(ls -d /sys/block/$1/mq/* 2>/dev/null | wc -l)
    sched=$(sed -n 's/.*\[\(.*\)\].*/\1/p' $q/scheduler); [ -n "$sched" ] || sched=none
    read -r rotational < $q/rotational
    read -r sectors < /sys/block/$1/size
    dev=/sys/block/$1/device; driver=; model=
    for p in $dev $dev/device $dev/device/device; do
        [ -z "$driver" ] && [ -e $p/driver ] && driver=$(basename $(readlink $p/driver))
        [ -z "$model" ] && [ -r $p/model ] && model=$(tr -d '"' < $p/model | sed 's/ *$//')
    done
    echo "@DISK_MARKER@ name=$1 size=$((sectors * 512)) queues=$queues scheduler=$sched" \
         "rotational=$rotational driver=$driver model=\"$model\""
}
