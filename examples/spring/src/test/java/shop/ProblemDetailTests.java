package shop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.http.HttpResponse;
import java.util.regex.Pattern;

import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;
import org.springframework.boot.test.context.SpringBootTest;

/**
 * The starter's own answers are Spring's ProblemDetail written by the application's JSON mapper:
 * this application indents its JSON (spring.jackson.serialization.indent-output), and so are they.
 */
@SpringBootTest(webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT,
    properties = "spring.jackson.serialization.indent-output=true")
class ProblemDetailTests extends ServiceTests {
    @Test
    @DisplayName("the starter's 400 key-missing is Spring's ProblemDetail through the application's converters")
    void problemDetail() throws Exception {
        HttpResponse<byte[]> r = post("/api/orders", null, 77, "{\"skuId\": 1, \"quantity\": 1}");
        String body = text(r);
        assertEquals(400, r.statusCode(), body);
        assertEquals("application/problem+json", r.headers().firstValue("Content-Type").orElse(""));
        assertEquals("false", r.headers().firstValue("Idempotent-Replayed").orElse(null), body);
        // RFC 9457's members, and only these (one per indented line: the application's mapper wrote them)
        assertEquals(4, Pattern.compile("(?m)^  \"").matcher(body).results().count(), body);
        assertTrue(Pattern.compile("\"type\"\\s*:\\s*\"urn:idem:error:key-missing\"").matcher(body).find(), body);
        assertTrue(Pattern.compile("\"status\"\\s*:\\s*400\\b").matcher(body).find(), body);
        assertTrue(Pattern.compile("\"title\"\\s*:\\s*\"[^\"]+\"").matcher(body).find(), body);
        assertTrue(Pattern.compile("\"detail\"\\s*:\\s*\"[^\"]*Idempotency-Key[^\"]*\"").matcher(body).find(), body);
    }
}
