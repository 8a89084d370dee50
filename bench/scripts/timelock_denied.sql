SELECT timelocked_acquire('hot-denied');
