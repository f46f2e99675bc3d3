package idem.spring;

import java.util.concurrent.TimeUnit;

import idem.servlet.Settings;
import org.springframework.beans.factory.ObjectProvider;
import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Timer;

/**
 * Micrometer meters of the idempotent routes (Actuator's metrics and Prometheus endpoints):
 * {@code idem.requests} (a timer: count and latency) by operation, outcome — executed,
 * replayed, conflict (a key reused with another request), in_flight (the key's first request
 * still running: 409 with Retry-After), refused (the other 4xx of the contract), error — and
 * status class (2xx, 4xx, 5xx); and
 * {@code idem.in_flight_waits} (a counter) by operation: the in_flight answers, registered at 0
 * for every {@code @Idempotent} operation at start-up.  No tag names a key or an owner.
 */
public final class IdemMetrics implements Settings.Observer {
    private final ObjectProvider<MeterRegistry> registries;

    /** The application's registry, looked up at each answer (none: nothing recorded). */
    public IdemMetrics(ObjectProvider<MeterRegistry> registries) {
        this.registries = registries;
    }

    static String outcome(int status, boolean replayed, String problem) {
        if (problem == null) {
            return replayed ? "replayed" : status >= 500 ? "error" : "executed";
        }
        return switch (problem) {
            case "key-reused" -> "conflict";
            case "in-flight" -> "in_flight";
            case "internal", "retry" -> "error";
            default -> "refused";
        };
    }

    private static Counter inFlightWaits(MeterRegistry registry, String operation) {
        return Counter.builder("idem.in_flight_waits")
            .description("Repeats that found their key's first request still running (answered 409 in-flight)")
            .tag("operation", operation).register(registry);
    }

    /** At start-up: each operation's idem.in_flight_waits, at 0, so a dashboard finds it before the first wait. */
    void registerOperation(String operation) {
        MeterRegistry registry = registries.getIfAvailable();
        if (registry != null) {
            inFlightWaits(registry, operation);
        }
    }

    @Override
    public void answered(String operation, int status, boolean replayed, String problem, long nanos) {
        MeterRegistry registry = registries.getIfAvailable();
        if (registry == null) {
            return;
        }
        String outcome = outcome(status, replayed, problem);
        Timer.builder("idem.requests").description("Requests of idempotent routes")
            .tag("operation", operation).tag("outcome", outcome).tag("status", status / 100 + "xx").register(registry)
            .record(nanos, TimeUnit.NANOSECONDS);
        if (outcome.equals("in_flight")) {
            inFlightWaits(registry, operation).increment();
        }
    }
}
