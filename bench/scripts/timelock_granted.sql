SELECT timelocked_acquire('hot-granted');
