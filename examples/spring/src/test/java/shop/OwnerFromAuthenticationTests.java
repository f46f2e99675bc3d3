package shop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Map;
import java.util.UUID;

import idem.spring.IdemOwnerResolver;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.boot.test.context.TestConfiguration;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Primary;

/**
 * The owner from Spring Security's Authentication ({@link IdemOwnerResolver#fromPrincipal}): the
 * same key sent by two users is two orders, each user's retry replays their own, and a request
 * without credentials is 401 no-owner — whatever X-Owner-Id it claims.
 */
@SpringBootTest(webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT)
class OwnerFromAuthenticationTests extends ServiceTests {
    /** Each user's owner id (a directory lookup in a real service). */
    static final long BASE = 1000 + (long) (Math.random() * 800000);
    static final Map<String, Long> OWNERS = Map.of("alice", BASE, "bob", BASE + 1);


    @TestConfiguration(proxyBeanMethods = false)
    static class Owners {
        @Bean
        @Primary
        IdemOwnerResolver ownerFromAuthentication() {
            return IdemOwnerResolver.fromPrincipal(p -> OWNERS.get(p.getName()));
        }
    }

    HttpResponse<String> post(String user, String key, String claimedOwner) throws Exception {
        HttpRequest.Builder r = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/api/orders"))
            .header("Content-Type", "application/json").header("Idempotency-Key", key)
            .POST(HttpRequest.BodyPublishers.ofString("{\"skuId\": 11, \"quantity\": 1}"));
        if (user != null) {
            r.header("Authorization", "Basic " + Base64.getEncoder().encodeToString(
                (user + ":" + user + "-secret").getBytes(StandardCharsets.UTF_8)));
        }
        if (claimedOwner != null) {
            r.header("X-Owner-Id", claimedOwner);
        }
        return HttpClient.newHttpClient().send(r.build(), HttpResponse.BodyHandlers.ofString());
    }

    @Test
    @DisplayName("the owner from Spring Security's Authentication: one key, two users, two orders; no credentials: 401")
    void ownerFromAuthentication() throws Exception {
        String k = "auth-" + UUID.randomUUID();
        HttpResponse<String> alice = post("alice", k, null);
        HttpResponse<String> bob = post("bob", k, Long.toString(BASE));       // claims alice's owner: ignored
        HttpResponse<String> aliceAgain = post("alice", k, null);
        assertEquals(201, alice.statusCode(), alice.body());
        assertEquals(201, bob.statusCode(), bob.body());
        assertEquals("false", bob.headers().firstValue("Idempotent-Replayed").orElse(null), "bob's own order");
        assertEquals("true", aliceAgain.headers().firstValue("Idempotent-Replayed").orElse(null));
        assertEquals(alice.body(), aliceAgain.body());
        assertEquals(1, orders(BASE));
        assertEquals(1, orders(BASE + 1));
        HttpResponse<String> anonymous = post(null, "auth-" + UUID.randomUUID(), Long.toString(BASE));
        assertEquals(401, anonymous.statusCode(), anonymous.body());
        assertTrue(anonymous.body().contains("urn:idem:error:no-owner"), anonymous.body());
        assertEquals(1, orders(BASE));
    }
}
