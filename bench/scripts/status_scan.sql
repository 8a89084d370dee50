SELECT count(*) FROM throttle.status;
