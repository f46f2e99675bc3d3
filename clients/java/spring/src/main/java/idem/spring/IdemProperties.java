package idem.spring;

import java.time.Duration;

import org.springframework.boot.context.properties.ConfigurationProperties;

/** {@code idem.*} application properties: clients/CONTRACT.md's settings. No property names a header. */
@ConfigurationProperties("idem")
public class IdemProperties {
    /** false: the starter configures nothing (no filter, no IdemTemplate, no health indicator). */
    private boolean enabled = true;
    /** 409 (the article) or 422 (the IETF draft) for a key reused with another request. */
    private int conflictStatus = 409;
    /** A larger request body is 413 before anything is claimed. */
    private long maxBodyBytes = 1024 * 1024;
    /** The record's lifetime (idem's ttl argument); unset: the server's idem.ttl. */
    private Duration ttl;
    /** The base URL of the problem types' documentation (a Link header); unset: none. */
    private String errorsUrl;
    /** false behind a transaction pooler (PgBouncer). */
    private boolean serverPrepare = true;
    /** Replay Set-Cookie headers (off: a session cookie must not be handed out twice). */
    private boolean replaySetCookie;

    public boolean isEnabled() { return enabled; }
    public void setEnabled(boolean enabled) { this.enabled = enabled; }
    public int getConflictStatus() { return conflictStatus; }
    public void setConflictStatus(int conflictStatus) { this.conflictStatus = conflictStatus; }
    public long getMaxBodyBytes() { return maxBodyBytes; }
    public void setMaxBodyBytes(long maxBodyBytes) { this.maxBodyBytes = maxBodyBytes; }
    public Duration getTtl() { return ttl; }
    public void setTtl(Duration ttl) { this.ttl = ttl; }
    public String getErrorsUrl() { return errorsUrl; }
    public void setErrorsUrl(String errorsUrl) { this.errorsUrl = errorsUrl; }
    public boolean isServerPrepare() { return serverPrepare; }
    public void setServerPrepare(boolean serverPrepare) { this.serverPrepare = serverPrepare; }
    public boolean isReplaySetCookie() { return replaySetCookie; }
    public void setReplaySetCookie(boolean replaySetCookie) { this.replaySetCookie = replaySetCookie; }
}
