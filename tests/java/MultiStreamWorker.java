import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.cloudwatch.CloudWatchAsyncClient;
import software.amazon.awssdk.services.dynamodb.DynamoDbAsyncClient;
import software.amazon.awssdk.services.kinesis.KinesisAsyncClient;
import software.amazon.kinesis.common.ConfigsBuilder;
import software.amazon.kinesis.common.InitialPositionInStream;
import software.amazon.kinesis.common.InitialPositionInStreamExtended;
import software.amazon.kinesis.common.KinesisClientUtil;
import software.amazon.kinesis.common.StreamConfig;
import software.amazon.kinesis.common.StreamIdentifier;
import software.amazon.kinesis.coordinator.Scheduler;
import software.amazon.kinesis.lifecycle.events.InitializationInput;
import software.amazon.kinesis.lifecycle.events.LeaseLostInput;
import software.amazon.kinesis.lifecycle.events.ProcessRecordsInput;
import software.amazon.kinesis.lifecycle.events.ShardEndedInput;
import software.amazon.kinesis.lifecycle.events.ShutdownRequestedInput;
import software.amazon.kinesis.metrics.NullMetricsFactory;
import software.amazon.kinesis.processor.FormerStreamsLeasesDeletionStrategy;
import software.amazon.kinesis.processor.MultiStreamTracker;
import software.amazon.kinesis.processor.RecordProcessorCheckpointer;
import software.amazon.kinesis.processor.ShardRecordProcessor;
import software.amazon.kinesis.processor.ShardRecordProcessorFactory;
import software.amazon.kinesis.retrieval.KinesisClientRecord;
import software.amazon.kinesis.retrieval.kpl.ExtendedSequenceNumber;
import software.amazon.kinesis.retrieval.polling.PollingConfig;

/**
 * A Java KCL 3.x multi-stream worker for the interop tests (the MultiLangDaemon reads one
 * stream only). Its one argument is JSON: ids (account:stream:creationEpoch, as our worker
 * derives them), app, kinesis, dynamodb, cloudwatch, region, worker, out, failover_ms,
 * assignment_ms. It reads from TRIM_HORIZON by polling, never deletes former streams' leases,
 * writes one JSON line per event to out (init, rec, checkpoint, shard_end, lost, shutdown,
 * stopped), checkpoints after each batch and at shard end, and shuts down gracefully on SIGTERM.
 */
public final class MultiStreamWorker {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static Writer out;

    static synchronized void emit(ObjectNode event) {
        try {
            out.write(JSON.writeValueAsString(event) + "\n");
            out.flush();
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
    }

    static ObjectNode event(String kind, StreamIdentifier stream, String shard) {
        ObjectNode node = JSON.createObjectNode().put("e", kind).put("shard", shard);
        return node.put("stream", stream.serialize());
    }

    static final class Processor implements ShardRecordProcessor {
        private final StreamIdentifier stream;
        private String shard = "?";

        Processor(StreamIdentifier stream) {
            this.stream = stream;
        }

        @Override
        public void initialize(InitializationInput input) {
            shard = input.shardId();
            ExtendedSequenceNumber at = input.extendedSequenceNumber();
            emit(event("init", stream, shard).put("seq", at.sequenceNumber())
                    .put("sub", at.subSequenceNumber()));
        }

        @Override
        public void processRecords(ProcessRecordsInput input) {
            String last = null;
            for (KinesisClientRecord record : input.records()) {
                byte[] data = new byte[record.data().remaining()];
                record.data().get(data);
                last = record.sequenceNumber();
                emit(event("rec", stream, shard).put("data", new String(data, StandardCharsets.UTF_8))
                        .put("seq", last).put("sub", record.subSequenceNumber()));
            }
            if (last != null) {
                checkpoint(input.checkpointer(), "checkpoint", last);
            }
        }

        /** Checkpoints at the last record delivered; seq says where that is, for the log. */
        private void checkpoint(RecordProcessorCheckpointer checkpointer, String kind, String seq) {
            try {
                checkpointer.checkpoint();
                emit(event(kind, stream, shard).put("seq", seq));
            } catch (Exception e) {
                emit(event("checkpoint_failed", stream, shard).put("error", e.toString()));
            }
        }

        @Override
        public void leaseLost(LeaseLostInput input) {
            emit(event("lost", stream, shard));
        }

        @Override
        public void shardEnded(ShardEndedInput input) {
            checkpoint(input.checkpointer(), "shard_end", "SHARD_END");
        }

        @Override
        public void shutdownRequested(ShutdownRequestedInput input) {
            checkpoint(input.checkpointer(), "shutdown", null);
        }
    }

    public static void main(String[] argv) throws Exception {
        JsonNode args = JSON.readTree(argv[0]);
        out = new OutputStreamWriter(new FileOutputStream(args.get("out").asText(), true),
                StandardCharsets.UTF_8);
        Region region = Region.of(args.get("region").asText());
        KinesisAsyncClient kinesis = KinesisClientUtil.createKinesisAsyncClient(KinesisAsyncClient.builder()
                .region(region).endpointOverride(URI.create(args.get("kinesis").asText())));
        DynamoDbAsyncClient dynamodb = DynamoDbAsyncClient.builder().region(region)
                .endpointOverride(URI.create(args.get("dynamodb").asText())).build();
        CloudWatchAsyncClient cloudwatch = CloudWatchAsyncClient.builder().region(region)
                .endpointOverride(URI.create(args.get("cloudwatch").asText())).build();

        InitialPositionInStreamExtended trimHorizon =
                InitialPositionInStreamExtended.newInitialPosition(InitialPositionInStream.TRIM_HORIZON);
        List<StreamConfig> streams = new ArrayList<>();
        for (JsonNode id : args.get("ids")) {
            streams.add(new StreamConfig(StreamIdentifier.multiStreamInstance(id.asText()), trimHorizon));
        }
        MultiStreamTracker tracker = new MultiStreamTracker() {
            @Override
            public List<StreamConfig> streamConfigList() {
                return streams;
            }

            @Override
            public FormerStreamsLeasesDeletionStrategy formerStreamsLeasesDeletionStrategy() {
                return new FormerStreamsLeasesDeletionStrategy.NoLeaseDeletionStrategy();
            }
        };
        ConfigsBuilder configs = new ConfigsBuilder(tracker, args.get("app").asText(), kinesis,
                dynamodb, cloudwatch, args.get("worker").asText(), new Factory());
        PollingConfig polling = new PollingConfig(kinesis).idleTimeBetweenReadsInMillis(250);
        Scheduler scheduler = new Scheduler(
                configs.checkpointConfig(),
                configs.coordinatorConfig().parentShardPollIntervalMillis(1000),
                configs.leaseManagementConfig().failoverTimeMillis(args.get("failover_ms").asLong())
                        .leaseAssignmentIntervalMillis(args.get("assignment_ms").asLong())
                        .shardSyncIntervalMillis(10000),
                configs.lifecycleConfig(),
                configs.metricsConfig().metricsFactory(new NullMetricsFactory()),
                configs.processorConfig(),
                configs.retrievalConfig().retrievalSpecificConfig(polling));

        Thread worker = new Thread(scheduler, "scheduler");
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                scheduler.startGracefulShutdown().get(30, TimeUnit.SECONDS);
            } catch (Exception e) {
                emit(JSON.createObjectNode().put("e", "shutdown_failed").put("error", e.toString()));
            }
            emit(JSON.createObjectNode().put("e", "stopped"));
        }));
        worker.start();
        emit(JSON.createObjectNode().put("e", "started"));
        worker.join();
    }

    /** Hands each shard's processor the stream its lease belongs to. */
    static final class Factory implements ShardRecordProcessorFactory {
        @Override
        public ShardRecordProcessor shardRecordProcessor() {
            throw new UnsupportedOperationException("multi-stream mode names the stream");
        }

        @Override
        public ShardRecordProcessor shardRecordProcessor(StreamIdentifier stream) {
            return new Processor(stream);
        }
    }
}
