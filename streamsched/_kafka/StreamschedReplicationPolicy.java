package dev.streamsched.mirror;

import org.apache.kafka.connect.mirror.IdentityReplicationPolicy;

/**
 * MirrorMaker 2's identity replication (names unchanged), with streamsched's own topics mirrored.
 *
 * Every stock policy treats a topic whose name starts with "__" as Kafka-internal and never
 * mirrors it; streamsched's state, delay, dead-letter, audit and control topics start with
 * "__streamsched." and are exactly what a failover needs.
 */
public class StreamschedReplicationPolicy extends IdentityReplicationPolicy {
    @Override
    public boolean isInternalTopic(String topic) {
        return !topic.startsWith("__streamsched.") && super.isInternalTopic(topic);
    }
}
