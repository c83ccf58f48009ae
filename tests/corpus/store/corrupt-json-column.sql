UPDATE trials SET latency = '{"n": ' WHERE route = 'base';
